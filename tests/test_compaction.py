"""Compaction of the primary's tables (delta-rs on a temp dir; no JVM, no sockets)."""

import datetime as dt
import json
import os

import pyarrow as pa
import pytest

from primary.compaction import COMPACTION_KEY, Compactor
from storage import deltars, tables
from tests.conftest import wait_until


def rows(start: int, n: int) -> pa.Table:
    now = dt.datetime.now(dt.timezone.utc)
    return pa.Table.from_pylist([dict(domain="d", queue="q", guid=i.to_bytes(16, "big"), seq=i, payload=b"p",
                                      properties=[], property_types=[], producer_time=now, put_time=now, epoch=1)
                                 for i in range(start, start + n)], schema=tables.PUTS_SCHEMA)


@pytest.mark.parametrize("durable", [True, False], ids=["fsync", "os"])
def test_compactor_bounds_file_count_and_keeps_every_row(tmp_path, durable):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, durable=durable)
    compactor = Compactor(path, every_commits=10, name="test", durable=durable)
    compactor.start()
    try:
        for i in range(25):  # appends go on while compaction runs in the background
            appender.append(rows(i * 4, 4))
            compactor.on_commit()
        wait_until(lambda: compactor.compactions >= 2, 30, what="two background compactions")
    finally:
        compactor.stop()
    table = deltars.try_open(path)
    assert len(table.file_uris()) < 25
    seqs = sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist())
    assert seqs == list(range(100))
    # Compaction commits say dataChange=false, so streaming readers skip them.
    optimize = [h["version"] for h in table.history() if h["operation"] == "OPTIMIZE" or h.get(COMPACTION_KEY)]
    assert optimize
    for version in optimize:
        actions = [json.loads(line) for line in (tmp_path / "puts" / "_delta_log" / f"{version:020d}.json").open()]
        files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        assert files and all(f["dataChange"] is False for f in files)


def test_a_durable_compaction_fsyncs_its_files_before_it_commits(tmp_path, monkeypatch):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    for i in range(5):
        appender.append(rows(i * 4, 4))
    before = set(os.listdir(path))
    calls: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    assert Compactor(path, every_commits=1, name="test").compact_now()["numFilesRemoved"] == 5
    written = [f for f in set(os.listdir(path)) - before if f.endswith(".parquet")]
    assert calls == [os.path.join(path, written[0]), path, os.path.join(path, "_delta_log", f"{6:020d}.json"),
                     os.path.join(path, "_delta_log")]
    assert sorted(deltars.try_open(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(20))


def test_tables_from_an_older_release_gain_new_columns(tmp_path):
    """The primary opens a PUT log written before `compression` existed: the
    column is added (old rows read null) and new rows carry it."""
    from deltalake import DeltaTable

    from storage import deltars, tables

    path = str(tmp_path / "puts")
    old_schema = pa.schema([f for f in tables.PUTS_SCHEMA if f.name != "compression"])
    DeltaTable.create(path, old_schema)
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    assert appender.table.schema().to_arrow().names == tables.PUTS_SCHEMA.names
    now = 1_700_000_000_000_000
    appender.append(pa.Table.from_pylist([dict(
        domain="d", queue="q", guid=b"g" * 16, seq=0, payload=b"p", properties=[], property_types=[],
        producer_time=now, put_time=now, epoch=1, compression="zstd")], schema=tables.PUTS_SCHEMA))
    assert DeltaTable(path).to_pyarrow_table(columns=["compression"])["compression"].to_pylist() == ["zstd"]
