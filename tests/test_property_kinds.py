"""The message property names and types the views make columns of
(storage/property_kinds.py): delta-rs tables on a temp dir, no JVM. Spark's own
query is the oracle in tests/test_tables.py."""

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import deltars, tables
from storage.property_kinds import PropertyKinds, batch_kinds

pytestmark = pytest.mark.unit

NAMES = st.sampled_from(["region", "n", "late", "a\x00b", "", "é"])
TYPES = st.sampled_from(["string", "int64", "int32", "bool", "binary"])
PAIRS = st.lists(st.tuples(NAMES, TYPES), unique_by=lambda p: p[0], max_size=4)


def oracle(rows: list[tuple[list | None, list | None]]) -> dict[str, frozenset[str]]:
    """Spark's `collect_set(property_types[k])` over `explode(map_keys(properties))`, row by row."""
    found: dict[str, set[str]] = {}
    for properties, types in rows:
        kinds = dict(types or [])
        for key, _ in properties or []:
            found.setdefault(key, set())
            if kinds.get(key) is not None:
                found[key].add(kinds[key])
    return {key: frozenset(kinds) for key, kinds in found.items()}


@st.composite
def row(draw):
    pairs = draw(PAIRS)
    properties = None if draw(st.integers(0, 9)) == 0 else [(k, "v") for k, _ in pairs]
    how = draw(st.sampled_from(["same", "same", "shuffled", "fewer", "more", "null type", "no map"]))
    types: list | None = list(pairs)
    if how == "shuffled":
        types = draw(st.permutations(pairs))
    elif how == "fewer":
        types = pairs[:-1]
    elif how == "more":
        types = pairs + [("only-typed", "int64")]
    elif how == "null type" and pairs:
        types = [(pairs[0][0], None)] + pairs[1:]
    elif how == "no map":
        types = None
    return properties, types


@settings(max_examples=2 * settings().max_examples // 5, deadline=None)   # 60 in the suite (conftest)
@given(rows=st.lists(row(), max_size=12), chunk=st.integers(1, 5), typed=st.booleans())
def test_each_name_gets_the_types_its_own_rows_gave_it(rows, chunk, typed):
    properties = pa.chunked_array([pa.array([r[0] for r in rows[i:i + chunk]], tables.PROPERTY_MAP)
                                   for i in range(0, len(rows), chunk)], tables.PROPERTY_MAP)
    types = pa.chunked_array([pa.array([r[1] for r in rows[i:i + chunk]], tables.PROPERTY_MAP)
                              for i in range(0, len(rows), chunk)], tables.PROPERTY_MAP)
    if typed:
        assert batch_kinds(properties, types) == oracle(rows)
    else:  # a file written before property_types existed
        assert batch_kinds(properties, None) == oracle([(p, None) for p, _ in rows])


def puts(start: int, properties: list[list[tuple[str, str]]], types: list[list[tuple[str, str]]]) -> pa.Table:
    now = dt.datetime.now(dt.timezone.utc)
    return pa.Table.from_pylist([dict(domain="d", queue="q", guid=i.to_bytes(16, "big"), seq=i, payload=b"p",
                                      properties=p, property_types=t, producer_time=now, put_time=now, epoch=1)
                                 for i, (p, t) in enumerate(zip(properties, types), start)], schema=tables.PUTS_SCHEMA)


def test_only_new_files_are_read_and_files_the_table_dropped_take_their_names_along(tmp_path):
    path = str(tmp_path / "puts")
    kinds = PropertyKinds()
    assert kinds.read([path]) == {}   # no table yet
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, durable=False)
    for i in range(3):
        appender.append(puts(i * 10, [[("region", "EU")]] * 10, [[("region", "string")]] * 10))
    assert kinds.read([path]) == {"region": frozenset({"string"})}
    assert kinds.files_read == 3
    assert kinds.read([path]) == {"region": frozenset({"string"})} and kinds.files_read == 3   # nothing new

    appender.append(puts(30, [[("region", "US"), ("n", "7")]], [[("region", "string"), ("n", "int64")]]))
    appender.append(puts(31, [[("n", "x")]], [[("n", "string")]]))
    assert kinds.read([path]) == {"region": frozenset({"string"}), "n": frozenset({"int64", "string"})}
    assert kinds.files_read == 5

    # Compaction: the inputs are forgotten, its output read once; the same names.
    appender.table.optimize.compact()
    assert kinds.read([path]) == {"region": frozenset({"string"}), "n": frozenset({"int64", "string"})}
    assert kinds.files_read == 6 and len(appender.table.file_uris()) == 1

    # Retention deletes the rows that had `n`: the name goes with them.
    appender.table.delete("seq >= 30")
    assert kinds.read([path]) == {"region": frozenset({"string"})}
    assert kinds.last == {"region": frozenset({"string"})}

    # Several logs (partitions) merge; one not created yet counts nowhere.
    other = str(tmp_path / "other")
    deltars.Appender(other, tables.PUTS_SCHEMA, durable=False).append(
        puts(0, [[("region", "x")]], [[("region", "binary")]]))
    assert kinds.read([path, other, str(tmp_path / "missing")]) == {"region": frozenset({"string", "binary"})}


def test_the_endpoints_views_are_registered_again_when_a_new_property_arrives(tmp_path, monkeypatch):
    import conf
    from pipelines import runner
    from storage import views

    calls: list[dict[str, frozenset[str]]] = []

    def register(spark, data_dir, partitions, persistent, properties):
        calls.append(properties.read([tables.PartitionPaths(data_dir, p).puts for p in partitions]))

    monkeypatch.setattr(views, "register_views", register)
    config = conf.ClusterConfig(data_dir=str(tmp_path), partitions=1)
    shared = runner.SharedViews(None, config)
    appender = deltars.Appender(tables.PartitionPaths(str(tmp_path), 0).puts, tables.PUTS_SCHEMA, durable=False)
    appender.append(puts(0, [[("region", "EU")]], [[("region", "string")]]))
    shared.refresh(0.0)
    assert calls == [{"region": frozenset({"string"})}]
    appender.append(puts(1, [[("region", "US")]], [[("region", "string")]]))
    shared.refresh(100.0)                                # same tables, same properties: nothing to do
    assert len(calls) == 1
    appender.append(puts(2, [[("n", "1")]], [[("n", "int64")]]))
    shared.refresh(130.0)
    assert len(calls) == 1                               # checked at 100 s: next at 160 s
    shared.refresh(160.0)
    assert calls[-1] == {"region": frozenset({"string"}), "n": frozenset({"int64"})}
    shared.refresh(160.0 + runner.VIEWS_REFRESH_S)      # the periodic registration
    assert len(calls) == 3
