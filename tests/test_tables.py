"""Queues as tables: plain readers, freshness, views, retention, replay.
Real node, proxy and pipeline processes; real Delta tables."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conf
from storage import deltars
from storage.spark import cache_dir
from storage.tables import PartitionPaths
from storage.views import register_views
from taproot import Session
from tests.conftest import collect, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parent.parent


def post(address, uri, payloads, properties=None) -> list[bytes]:
    with Session([address]) as session, session.open_queue(uri, write=True) as queue:
        futures = [queue.post(p, properties) for p in payloads]
        return [f.result(timeout=60).guid for f in futures]


def consume(address, uri, count, confirm=True, timeout_s=90):
    with Session([address]) as session, session.open_queue(uri, read=True) as queue:
        got = collect(queue, count, timeout_s, confirm=False)
        if confirm:
            queue.confirm(got)
            queue.flush()
        return got


def guids_in(path: str) -> set[bytes]:
    table = deltars.try_open(path)
    return set() if table is None else set(table.to_pyarrow_table(columns=["guid"])["guid"].to_pylist())


def test_message_is_visible_to_spark_sql_as_soon_as_its_ack_arrives(cluster, spark):
    register_views(spark, cluster.data_dir, [0])
    with Session([cluster.proxy_address]) as session, session.open_queue("taproot://keep/fresh", write=True) as q:
        for i in range(3):
            ack = q.post(b"fresh %d" % i, properties={"region": "EU", "n": i}).result(timeout=60)
            # Views registered before the message existed: each query reads the latest version.
            row = spark.sql(f"SELECT payload, properties['region'], CAST(properties['n'] AS INT) FROM taproot_messages "
                            f"WHERE guid_hex = '{ack.guid.hex().upper()}'").collect()
            assert [tuple(r) for r in row] == [(b"fresh %d" % i, "EU", i)]


def test_every_table_opens_with_spark_delta_rs_and_duckdb_without_taproot_code(cluster, tmp_path):
    guids = post(cluster.proxy_address, "taproot://keep/readers", [b"r%d" % i for i in range(5)], {"region": "EU"})
    consume(cluster.proxy_address, "taproot://keep/readers", 5)
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: set(guids) <= guids_in(paths.confirms), 30, what="the confirms")
    wait_until(lambda: set(guids) <= guids_in(paths.delivery), 120, interval_s=0.5, what="the delivery rows")
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "plain_readers.py"), cluster.data_dir,
                             str(cache_dir() / "ivy" / "jars")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["taproot_modules"] == []
    expected = {t: len(deltars.try_open(getattr(paths, t)).to_pyarrow_table(columns=["guid"]))
                for t in ("puts", "delivery", "confirms", "dead_letters", "disagreements")}
    assert expected["puts"] >= 5 and expected["confirms"] >= 5
    assert seen["deltars"] == seen["duckdb"] == seen["spark"] == expected
    assert expected["disagreements"] == 0
    assert seen["duckdb_eu"] >= 5
    assert seen["deltars_time_travel_v0"] == seen["spark_time_travel_v0"] == 0  # version 0: the empty table
    # The change feed of the delivery log (append-only until retention runs).
    assert seen["deltars_cdf_inserts"] == seen["spark_cdf_inserts"] == expected["delivery"]
    # Spark writes timestamps as INT64 microseconds, not INT96 (which pyarrow
    # reads as nanoseconds, overflowing outside 1677-2262).
    import pyarrow.parquet as pq
    files = sorted(Path(paths.delivery).glob("*.parquet"), key=lambda f: f.stat().st_mtime)
    physical = pq.ParquetFile(files[-1]).schema  # the newest file, written by this release
    types = {physical.column(i).name: physical.column(i).physical_type for i in range(len(physical))}
    assert types["put_time"] == types["delivered_time"] == "INT64", types


def test_views_show_backlog_latency_rates_and_dead_letters(cluster, spark):
    uri = "taproot://keep/views"
    guids = set(post(cluster.proxy_address, uri, [b"v%d" % i for i in range(6)], {"region": "US"}))
    got = consume(cluster.proxy_address, uri, 4)  # 4 confirmed, 2 left: the session closes, they go back
    assert len(got) >= 4
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: len(guids_in(paths.confirms) & {m.guid for m in got}) == len(got), 30, what="confirms")
    wait_until(lambda: len(guids_in(paths.delivery) & guids) == 6, 120, interval_s=0.5,
               what="the pipeline's delivery rows")
    register_views(spark, cluster.data_dir, [0])
    backlog = spark.sql("SELECT delivered, confirmed, backlog FROM taproot_backlog "
                        "WHERE domain = 'keep' AND queue = 'views'").collect()
    assert [tuple(r) for r in backlog] == [(6, len(got), 6 - len(got))]
    latency = spark.sql("SELECT count(*), count(confirm_ms), min(delivery_ms) > 0 FROM taproot_latency "
                        "WHERE queue = 'views'").first()
    assert tuple(latency) == (6, len(got), True)
    rates = spark.sql("SELECT sum(puts), sum(delivered), sum(confirms) FROM taproot_rates "
                      "WHERE queue = 'views'").first()
    assert tuple(rates) == (6, 6, len(got))
    assert spark.sql("SELECT count(*) FROM taproot_dead_letters WHERE domain = 'keep'").first()[0] == 0
    # The express lane and the pipeline decided these alike.
    assert spark.sql("SELECT count(*) FROM taproot_disagreements WHERE domain = 'keep' AND queue = 'views'"
                     ).first()[0] == 0


def test_retention_removes_finished_old_messages_only_and_nothing_comes_back(cluster, spark):
    from pipelines.retention import maintain

    finished = post(cluster.proxy_address, "taproot://hist/jobs", [b"done%d" % i for i in range(5)])
    assert len(consume(cluster.proxy_address, "taproot://hist/jobs", 5)) == 5
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: set(finished) <= guids_in(paths.confirms), 30, what="the confirms")
    pending = post(cluster.proxy_address, "taproot://hist/jobs", [b"wait0", b"wait1"])
    kept = post(cluster.proxy_address, "taproot://keep/forever", [b"k0"])  # newest row of the partition
    wait_until(lambda: set(pending + kept) <= guids_in(paths.delivery), 60, what="delivery of the rest")
    time.sleep(1.5)  # older than the domain's retention (1 s) and dedup window (1 s)

    config = conf.load(cluster.config_path, data_dir=cluster.data_dir)
    report = maintain(spark, config)
    assert report.partitions[0].removed_messages == 5, report.summary()
    for table in (paths.delivery, paths.puts, paths.confirms):
        assert not set(finished) & guids_in(table), table
    assert set(pending) <= guids_in(paths.delivery) and set(pending) <= guids_in(paths.puts)
    assert set(kept) <= guids_in(paths.delivery)
    assert report.partitions[0].vacuumed_files > 0
    # Spark reads the PUT log's delete commit (`deltars.delete_rows`): its history, and its change
    # feed, where the removed messages are deletes and no row comes back as an insert.
    [deleted_at] = [r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{paths.puts}`").collect()
                    if r.operation == "DELETE"]
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", deleted_at)
            .option("endingVersion", deleted_at).load(paths.puts).select("guid", "_change_type").collect())
    assert sorted((bytes(r.guid), r._change_type) for r in feed) == sorted((g, "delete") for g in finished)

    # Nothing removed comes back: not to a consumer now, not after a primary restart.
    with Session([cluster.proxy_address]) as session, session.open_queue("taproot://hist/jobs", read=True) as q:
        again = [q.get(timeout_s=30) for _ in range(2)]
        assert sorted(m.payload for m in again) == [b"wait0", b"wait1"]
        assert list(q.messages(timeout_s=3)) == []
        q.confirm(again)
    cluster.restart_node()
    wait_until(lambda: _opens(cluster.proxy_address), 60, what="the proxy to reconnect")
    assert consume(cluster.proxy_address, "taproot://hist/jobs", 1, timeout_s=5) == []
    # The pipeline carries on past the deletes in its source (skipChangeCommits).
    later = post(cluster.proxy_address, "taproot://hist/jobs", [b"after"])
    assert [m.guid for m in consume(cluster.proxy_address, "taproot://hist/jobs", 1)] == later


def _opens(address: str) -> bool:
    from taproot import TaprootError
    try:
        with Session([address], connect_timeout_s=2) as s, s.open_queue("taproot://keep/ping", write=True,
                                                                          timeout_s=5):
            return True
    except TaprootError:
        return False


def test_replay_posts_selected_history_through_the_put_path_with_new_guids(cluster, spark):
    from pipelines.replay import replay
    from storage.tables import PartitionPaths

    source, target = "taproot://keep/source", "taproot://keep/replayed"
    first = post(cluster.proxy_address, source, [b"a%d" % i for i in range(4)], {"region": "EU"})
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: set(first) <= guids_in(paths.delivery), 60, what="the first messages delivered")
    version = deltars.try_open(paths.delivery).version()
    second = post(cluster.proxy_address, source, [b"b%d" % i for i in range(4)], {"region": "US"})
    wait_until(lambda: set(second) <= guids_in(paths.delivery), 60, what="the second messages delivered")

    eu = replay(spark, cluster.data_dir, 1, [cluster.proxy_address], source, target,
                where="properties['region'] = 'EU'", rate=200)
    assert (eu.selected, eu.acked, eu.failed) == (4, 4, {})
    old = replay(spark, cluster.data_dir, 1, [cluster.proxy_address], source, target, version=version)
    assert (old.selected, old.acked) == (4, 4)           # as of that version: only the first four existed
    got = consume(cluster.proxy_address, target, 8)
    assert [m.payload for m in got] == [b"a0", b"a1", b"a2", b"a3"] * 2  # PUT order, each replay in turn
    assert not {m.guid for m in got} & set(first)          # new GUIDs
    assert all(m.properties == {"region": "EU"} for m in got)


def test_replay_between_since_and_until_at_the_original_rate(cluster, spark):
    """--since/--until select by PUT time, [since, until); --original-rate
    posts with the original spacing: ten seconds of paced PUTs replay in ten
    seconds (within 10 %), as the replayed rows' own PUT times show too."""
    import datetime as dt

    from pipelines.replay import replay

    source, target = "taproot://keep/paced", "taproot://keep/paced-replayed"
    before = post(cluster.proxy_address, source, [b"before%d" % i for i in range(3)])
    time.sleep(1.1)
    rate, seconds = 40, 10.0
    paced: list[bytes] = []
    with Session([cluster.proxy_address]) as session, session.open_queue(source, write=True) as queue:
        started = time.monotonic()
        futures = []
        for i in range(int(rate * seconds)):
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
            futures.append(queue.post(b"paced%04d" % i))
            queue.flush()
        paced = [f.result(timeout=60).guid for f in futures]
    time.sleep(1.1)
    after = post(cluster.proxy_address, source, [b"after%d" % i for i in range(3)])
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: set(before + paced + after) <= guids_in(paths.delivery), 90, what="the source delivered")

    puts = deltars.try_open(paths.puts).to_pyarrow_table(columns=["guid", "put_time"])
    put_time = dict(zip(puts["guid"].to_pylist(), puts["put_time"].to_pylist()))
    first, last = min(put_time[g] for g in paced), max(put_time[g] for g in paced)
    since = first.strftime("%Y-%m-%d %H:%M:%S.%f")
    until = (last + dt.timedelta(microseconds=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    result = replay(spark, cluster.data_dir, 1, [cluster.proxy_address], source, target,
                    since=since, until=until, original_rate=True)
    assert (result.selected, result.acked, result.failed) == (len(paced), len(paced), {})
    span = (last - first).total_seconds()
    print(f"original: {len(paced)} PUTs over {span:.2f} s; replayed at the original rate in {result.seconds:.2f} s")
    assert abs(result.seconds - span) <= 0.1 * span

    got = consume(cluster.proxy_address, target, len(paced))
    assert [m.payload for m in got] == [b"paced%04d" % i for i in range(len(paced))]   # only [since, until)
    wait_until(lambda: {m.guid for m in got} <= guids_in(paths.puts), 30, what="the replayed PUTs' rows")
    replayed = deltars.try_open(paths.puts).to_pyarrow_table(columns=["guid", "put_time"])
    times = dict(zip(replayed["guid"].to_pylist(), replayed["put_time"].to_pylist()))
    again = (max(times[m.guid] for m in got) - min(times[m.guid] for m in got)).total_seconds()
    assert abs(again - span) <= 0.1 * span, (again, span)


def test_full_speed_replay_keeps_put_order_across_staged_files_and_cleans_up(cluster, spark):
    import pyarrow as pa

    from pipelines.replay import replay

    source, target = "taproot://keep/bulk", "taproot://keep/bulk-replayed"
    payloads = [b"m%05d" % i for i in range(3000)]
    with Session([cluster.proxy_address]) as session, session.open_queue(source, write=True) as queue:
        futures = [queue.post_columns(pa.table({"payload": pa.array(payloads[i:i + 1000], pa.binary())}))
                   for i in range(0, len(payloads), 1000)]
        posted = {g for f in futures for g in f.result(timeout=60)}
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: posted <= guids_in(paths.delivery), 90, what="the bulk messages delivered")

    # Tiny staged files and frames: many files (several per sorted run) and many frames, all in PUT order.
    result = replay(spark, cluster.data_dir, 1, [cluster.proxy_address], source, target,
                    bulk_rows=250, stage_file_rows=400)
    assert (result.selected, result.posted, result.acked, result.failed) == (3000, 3000, 3000, {})
    assert result.select_seconds > 0 and result.rate > 0
    assert not list((Path(cluster.data_dir) / "_replay").glob("*"))  # staging removed
    with Session([cluster.proxy_address]) as session, session.open_queue(target, read=True) as queue:
        got = collect(queue, 3000, 90)  # confirming as they come: more than one consumer window
    assert [m.payload for m in got] == payloads
    assert not {m.guid for m in got} & posted


def test_spark_reads_a_durable_table_as_delta_rs_wrote_it_and_skips_files_by_its_statistics(spark, tmp_path):
    """The files are pyarrow's and the statistics ours: Spark must read the
    same rows (maps, timestamps, nulls) and prune by seq and put_time."""
    import datetime as dt

    from pyspark.sql import functions as F

    from storage import tables
    from tests.test_durability import T0, puts

    durable = deltars.Appender(str(tmp_path / "durable"), tables.PUTS_SCHEMA)
    plain = deltars.Appender(str(tmp_path / "plain"), tables.PUTS_SCHEMA, durable=False)
    for start in (0, 100, 200):
        batch = puts(20, start)
        durable.append(batch)
        plain.append(batch)

    def rows(name: str, where=None):
        df = spark.read.format("delta").load(str(tmp_path / name)).drop("guid")
        df = df.where(where) if where is not None else df
        return sorted(tuple(map(str, r)) for r in df.collect())

    assert rows("durable") == rows("plain") and len(rows("durable")) == 60
    between = (F.col("seq") >= 100) & (F.col("seq") < 200)
    assert rows("durable", between) == rows("plain", between) and len(rows("durable", between)) == 20
    late = F.col("put_time") >= F.lit(T0 - dt.timedelta(seconds=2))
    assert rows("durable", late) == rows("plain", late) and len(rows("durable", late)) == 6
    scanned = spark.read.format("delta").load(str(tmp_path / "durable")).where(between)
    files = scanned.inputFiles()
    assert len(files) == 1, files  # the statistics pruned the other two files


def test_the_backlog_view_counts_as_a_join_of_each_table_with_the_deliveries_would(spark):
    """`storage.views.BACKLOG_SQL` (one pass, grouped twice) against the join it
    replaced, on random tables with what the real ones hold at times: a
    message delivered twice, confirmed twice, confirmed and dead-lettered,
    confirms and dead letters of nothing delivered, apps that never confirm."""
    import datetime
    import random

    from storage.views import BACKLOG_SQL

    rng = random.Random(22)
    start = datetime.datetime(2026, 11, 28)
    targets, confirms, dead = [], [], []
    for i in range(400):
        guid, queue = i.to_bytes(16, "big"), rng.choice(["q1", "q2", "q3"])
        apps = rng.choice([[""], ["a"], ["a", "b"], ["a", "b", "c"]])
        for _ in range(rng.choice([1, 1, 1, 2])):          # a delivery row twice now and then
            put_time = start + datetime.timedelta(seconds=rng.randrange(1000))
            targets += [("d", queue, guid, app, put_time) for app in apps]
        for app in apps + ["zz"]:                           # "zz": an app it was never delivered to
            if rng.random() < 0.5:
                confirms += [(guid, app)] * rng.choice([1, 2])
            if rng.random() < 0.2:
                dead.append((guid, app))
    for i in range(400, 420):                               # confirms of nothing delivered
        confirms.append((i.to_bytes(16, "big"), "a"))
    spark = spark.newSession()      # temporary views of its own: other tests' views stay as they were
    spark.createDataFrame(targets, "domain string, queue string, guid binary, app_id string, put_time timestamp"
                          ).createOrReplaceTempView("taproot__targets")
    spark.createDataFrame(confirms, "guid binary, app_id string").createOrReplaceTempView("taproot_confirms")
    spark.createDataFrame(dead, "guid binary, app_id string").createOrReplaceTempView("taproot_dead_letters")
    joined = """
        SELECT t.domain, t.queue, t.app_id, count(*) AS delivered, count(c.guid) AS confirmed,
               count(CASE WHEN c.guid IS NULL AND x.guid IS NOT NULL THEN 1 END) AS dead_lettered,
               count(CASE WHEN c.guid IS NULL AND x.guid IS NULL THEN 1 END) AS backlog,
               min(CASE WHEN c.guid IS NULL AND x.guid IS NULL THEN t.put_time END) AS oldest_waiting_put_time
        FROM taproot__targets t
        LEFT JOIN (SELECT DISTINCT guid, app_id FROM taproot_confirms) c ON t.guid = c.guid AND t.app_id = c.app_id
        LEFT JOIN (SELECT DISTINCT guid, app_id FROM taproot_dead_letters) x
               ON t.guid = x.guid AND t.app_id = x.app_id
        GROUP BY t.domain, t.queue, t.app_id"""
    expected = sorted(map(tuple, spark.sql(joined).collect()))
    got = sorted(map(tuple, spark.sql(BACKLOG_SQL).collect()))
    assert got == expected
    assert {row[2] for row in got} == {"", "a", "b", "c"} and all(row[4] and row[5] for row in got)


def test_the_property_columns_are_what_spark_finds_in_the_put_logs(spark, tmp_path):
    """storage.property_kinds reads the PUT logs' files with pyarrow; Spark's
    query over the same rows is the oracle. Rows whose types disagree with
    their properties (missing, extra, another order, null) included."""
    from storage import tables
    from storage.property_kinds import PropertyKinds
    from tests.test_property_kinds import puts

    data = str(tmp_path / "data")
    path = PartitionPaths(data, 0).puts
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, durable=False)
    appender.append(puts(0, [[("region", "EU"), ("n", "1")], [("region", "US"), ("n", "2")]],
                         [[("region", "string"), ("n", "int64")], [("n", "int64"), ("region", "string")]]))
    appender.append(puts(2, [[("flag", "true"), ("blob", "AAE=")], [("odd", "x")], []],
                         [[("flag", "bool"), ("blob", "binary"), ("extra", "int64")], [], [("odd", None)]]))
    appender.append(puts(5, [[("mixed", "1")], [("mixed", "a")]], [[("mixed", "int64")], [("mixed", "string")]]))
    kinds = PropertyKinds().read([path])
    found = spark.sql("SELECT k, collect_set(property_types[k]) AS types FROM (SELECT property_types, "
                      f"explode(map_keys(properties)) AS k FROM delta.`{path}`) GROUP BY k").collect()
    assert kinds == {r.k: frozenset(r.types) for r in found}
    assert set(kinds) == {"region", "n", "flag", "blob", "odd", "mixed"}

    register_views(spark, data, [0])
    columns = {f.name: f.dataType.simpleString() for f in spark.table("taproot_messages").schema.fields}
    assert {k: columns[k] for k in kinds} == {"region": "string", "n": "bigint", "flag": "boolean", "blob": "binary",
                                              "odd": "string", "mixed": "string"}
    rows = spark.sql("SELECT seq, n, flag, blob FROM taproot_messages WHERE seq IN (1, 2) ORDER BY seq").collect()
    assert [tuple(r) for r in rows] == [(1, 2, None, None), (2, None, True, b"\x00\x01")]


def test_the_views_warm_up_reads_scratch_tables_of_its_own_that_fill_every_view(spark, tmp_path, caplog):
    """The endpoint's views are warmed up over `write_scratch_tables`, not over
    the cluster's tables (their size would set its cost): every view has rows
    from them, and the warm-up's own session leaves the catalog as it was."""
    import logging
    import threading

    from pipelines.runner import SharedViews, write_scratch_tables

    write_scratch_tables(str(tmp_path))
    session = spark.newSession()
    register_views(session, str(tmp_path), [0])
    backlog = session.sql("SELECT app_id, delivered, confirmed, dead_lettered, backlog FROM taproot_backlog").collect()
    assert sorted(map(tuple, backlog)) == [("a", 3, 1, 0, 2), ("b", 3, 0, 1, 2)]
    for view in ("taproot_messages", "taproot_latency", "taproot_rates", "taproot_disagreements"):
        assert session.sql(f"SELECT * FROM {view}").count() > 0, view
    assert session.sql("SELECT k FROM taproot_messages").collect()[0].k == "v"   # a property as a column

    before = {t.name for t in spark.catalog.listTables()}
    views = SharedViews(spark, None, warm=True)     # reads no config: nothing of a cluster's

    def warm_up_ends():
        wait_until(lambda: not any(t.name == "taproot-views-warm-up" for t in threading.enumerate()), 120)

    with caplog.at_level(logging.INFO, logger="pipelines.runner"):
        views._govern_warm_up(10.0)                 # the authority is behind: not yet
        assert views.warm and views._warming is None
        views._govern_warm_up(0.0)
        views._govern_warm_up(10.0)                 # behind again: it gives way, to run later
        views._govern_warm_up(10.0)
        warm_up_ends()
        assert caplog.text.count("gives way to the authority (lag 10.0 s)") == 1, caplog.text
        assert views.warm and "warmed up" not in caplog.text and "not warmed up" not in caplog.text
        views._govern_warm_up(1.0)
        warm_up_ends()
    assert "Spark Connect views warmed up in" in caplog.text, caplog.text
    assert not views.warm and "not warmed up" not in caplog.text
    assert {t.name for t in spark.catalog.listTables()} == before
