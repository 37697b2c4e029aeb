"""Spark tier: the pipeline's transforms and its exactly-once write."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.dedup import judged_puts_version, legacy_delivery_columns, to_delivery_rows, write_delivery_batch
from pipelines.runner import create_delivery_table
from storage.tables import DELIVERY_SCHEMA, PUTS_SCHEMA, spark_ddl
from tests.conftest import spark_offset_entry

pytestmark = pytest.mark.spark


def puts_df(spark, guids, domain="d", props=lambda i: ({}, {}), queue="q"):
    now = dt.datetime.now(dt.timezone.utc)
    rows = [(domain, queue, g, i, b"p", *props(i), now, now, 1, None) for i, g in enumerate(guids)]
    return spark.createDataFrame(rows, spark_ddl(PUTS_SCHEMA).replace(" NOT NULL", ""))


def append_puts(appender, seq: int, rows: list[tuple[bytes, dt.datetime]]) -> None:
    """One commit of PUT rows (GUID, put time), seqs from `seq`, through the primary's appender."""
    import pyarrow as pa

    appender.append(pa.Table.from_pylist([dict(
        domain="d", queue="q", guid=guid, seq=seq + i, payload=b"p", properties=[],
        property_types=[], producer_time=at, put_time=at, epoch=1) for i, (guid, at) in enumerate(rows)],
        schema=PUTS_SCHEMA))


def append_put(appender, seq: int) -> None:
    """One PUT row of seq `seq` through the primary's appender."""
    append_puts(appender, seq, [(seq.to_bytes(16, "big"), dt.datetime.now(dt.timezone.utc))])


def run_put_stream(spark, puts: str, checkpoint: str, out: str) -> None:
    """The pipeline's PUT-log stream into a Delta table, once over what is there."""
    from pipelines.dedup import put_stream

    query = (put_stream(spark, puts).writeStream.format("delta").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(out))
    assert query.awaitTermination(120)


def test_delivery_rows_identify_and_route_without_copying_the_payload(spark):
    out = to_delivery_rows(puts_df(spark, [b"a" * 16]), 7, partition=3)
    assert out.columns == [f.name for f in DELIVERY_SCHEMA]
    assert "payload" not in out.columns and "properties" not in out.columns
    assert out.select("batch_id", "partition").first() == (7, 3)


def test_delivery_commit_records_the_judged_puts_version(spark, tmp_path):
    from deltalake import DeltaTable
    path = str(tmp_path / "delivery")
    create_delivery_table(spark, path)
    write_delivery_batch(puts_df(spark, [b"a" * 16]), 0, path, "app-1", puts_version=12)
    assert json.loads(DeltaTable(path).history(1)[0]["userMetadata"]) == {"puts_version": 12}


def test_replayed_batch_adds_no_duplicates(spark, tmp_path):
    path = str(tmp_path / "delivery")
    create_delivery_table(spark, path)
    batch = puts_df(spark, [bytes([i]) * 16 for i in range(5)])
    write_delivery_batch(batch, 0, path, "app-1")
    write_delivery_batch(batch, 0, path, "app-1")  # Spark replays batch 0 after a crash
    table = spark.read.format("delta").load(path)
    assert table.count() == 5
    write_delivery_batch(puts_df(spark, [b"z" * 16]), 1, path, "app-1")
    expected = spark.createDataFrame([(bytes([i]) * 16,) for i in range(5)] + [(b"z" * 16,)], "guid binary")
    assert_df_equality(table.select("guid").orderBy("guid"), expected.orderBy("guid"), ignore_nullable=True)
    assert spark.read.format("delta").load(path).filter(F.col("batch_id") == 1).count() == 1


def test_fanout_targets_apps_by_their_subscriptions_in_spark_sql(spark):
    from conf import parse_domain

    domains = {"f": parse_domain("f", {"mode": "fanout", "app_ids": ["all", "eu", "big"], "subscriptions": {
        "eu": "region = 'EU'", "big": "amount > 100"}}),
        "p": parse_domain("p", {"subscriptions": {"": "exists(keep)"}})}

    def props(i):
        region, amount = ("EU", 500) if i == 0 else ("US", 5) if i == 1 else ("EU", "lots")
        return ({"region": region, "amount": str(amount)},
                {"region": "string", "amount": "int32" if isinstance(amount, int) else "string"})

    fan = to_delivery_rows(puts_df(spark, [bytes([i]) * 16 for i in range(3)], "f", props), 0, domains)
    assert [sorted(r.apps) for r in fan.orderBy("seq").collect()] == [["all", "big", "eu"], ["all"], ["all", "eu"]]
    prio = to_delivery_rows(puts_df(spark, [b"k" * 16, b"n" * 16], "p", lambda i: (
        ({"keep": "1"}, {"keep": "int32"}) if i == 0 else ({}, {}))), 0, domains)
    assert [r.apps for r in prio.orderBy("seq").collect()] == [[""], []]   # [] = auto-confirmed
    other = to_delivery_rows(puts_df(spark, [b"o" * 16], "unknown"), 0, domains)
    assert other.first().apps == [""]
    # queue@cluster: stored here for a federation link to forward, delivered to no app here.
    for domain in ("f", "p", "unknown"):
        routed = to_delivery_rows(puts_df(spark, [b"r" * 16], domain, queue="replies@paris"), 0, domains)
        assert routed.first().apps == []


def test_delivery_table_from_an_older_release_gains_the_new_columns(spark, tmp_path):
    """A delivery log made before the express lane copied the PUT row (payload
    NOT NULL) and had no apps or partition: it gains the new columns and keeps
    getting its old ones filled."""
    path = str(tmp_path / "old")
    old_columns = [f for f in PUTS_SCHEMA if f.name != "compression"] + [
        f for f in DELIVERY_SCHEMA if f.name in ("delivered_time", "batch_id")]
    import pyarrow as pa
    spark.sql(f"CREATE TABLE delta.`{path}` ({spark_ddl(pa.schema(old_columns))}) USING DELTA")
    create_delivery_table(spark, path)
    assert {f.name for f in DELIVERY_SCHEMA} <= set(spark.read.format("delta").load(path).columns)
    legacy = legacy_delivery_columns(spark, path)
    assert "payload" in legacy
    write_delivery_batch(puts_df(spark, [b"a" * 16]), 0, path, "app-1", legacy_columns=legacy)
    row = spark.read.format("delta").load(path).first()
    assert row.apps == [""] and row.payload == b"p"


def test_judged_puts_version_reads_the_offset_log(tmp_path):
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "4").write_text(spark_offset_entry(9))
    (offsets / "5").write_text(spark_offset_entry(3, index=2, starting=True))
    (offsets / "6").write_text("garbage")
    assert judged_puts_version(str(tmp_path), 4) == 8
    assert judged_puts_version(str(tmp_path), 5) is None      # inside the initial snapshot
    assert judged_puts_version(str(tmp_path), 6) is None
    assert judged_puts_version(str(tmp_path), 7) is None      # missing


def test_the_stream_reads_no_payload_unless_an_older_delivery_log_copies_it(spark, tmp_path, capsys):
    """The projection sits before the dedup, so the Parquet scan of every
    micro-batch skips the payload column (a foreachBatch DataFrame is already
    planned: selecting there would not reach the scan)."""
    from pipelines.dedup import put_stream
    path = str(tmp_path / "puts")
    puts_df(spark, [bytes([i]) * 16 for i in range(3)]).write.format("delta").save(path)
    stream = put_stream(spark, path)
    assert "payload" not in stream.columns and {"guid", "seq", "properties"} <= set(stream.columns)
    query = (stream.writeStream.format("memory").queryName("scan_columns")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    capsys.readouterr()
    query.explain()
    plan = capsys.readouterr().out
    scans = [line for line in plan.splitlines() if "ReadSchema" in line]
    assert scans and all("payload" not in line and "guid" in line for line in scans), plan
    assert spark.table("scan_columns").count() == 3
    assert "payload" in put_stream(spark, path, legacy_columns=("payload", "epoch")).columns


def test_stream_resume_version_is_the_start_of_the_last_batch(tmp_path):
    """Spark, restarting, hands the last batch of the offset log to the Delta
    source again, committed or not: its start must stay readable."""
    from storage.tables import stream_resume_version
    assert stream_resume_version(str(tmp_path)) is None                       # no checkpoint yet
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "0").write_text(spark_offset_entry(4))
    assert stream_resume_version(str(tmp_path)) == 4                          # batch 0 planned, not committed
    (tmp_path / "commits" / "0").write_text("v1\n{}")
    assert stream_resume_version(str(tmp_path)) == 4                          # batch 0 replayed from its start
    (tmp_path / "offsets" / "1").write_text(spark_offset_entry(9))          # planned: may be run again from 4
    assert stream_resume_version(str(tmp_path)) == 4
    (tmp_path / "commits" / "1").write_text("v1\n{}")
    (tmp_path / "commits" / ".2.tmp").write_text("")
    assert stream_resume_version(f"file:{tmp_path}") == 4                     # committed: still replayed from 4
    (tmp_path / "offsets" / "2").write_text(spark_offset_entry(12))
    assert stream_resume_version(str(tmp_path)) == 9
    (tmp_path / "commits" / "2").write_text("v1\n{}")
    assert stream_resume_version(str(tmp_path)) == 9
    (tmp_path / "offsets" / "2").write_text("v1\n{}\ngarbage")
    (tmp_path / "offsets" / "3").write_text(spark_offset_entry(15))
    assert stream_resume_version(str(tmp_path)) is None                       # not understood: assume nothing
    assert stream_resume_version("s3://bucket/cp") is None


def test_the_dedup_stream_resumes_after_the_put_log_is_trimmed_to_its_resume_version(spark, tmp_path):
    """Trimming the PUT log behind what the stream's checkpoint says it
    resumes from loses it nothing: after a restart it reads every later PUT.
    Two batches first: on a restart Spark replays the last one's offsets
    through the Delta source, so its start must still be in the log."""
    from storage import deltars
    from storage.tables import stream_offset, stream_resume_version

    puts, checkpoint, out = (str(tmp_path / n) for n in ("puts", "cp", "out"))
    appender = deltars.Appender(puts, PUTS_SCHEMA)
    for seq in range(25):
        append_put(appender, seq)
    run_put_stream(spark, puts, checkpoint, out)          # batch 0
    for seq in range(25, 45):
        append_put(appender, seq)
    run_put_stream(spark, puts, checkpoint, out)          # batch 1
    for seq in range(45, 65):
        append_put(appender, seq)
    resume = stream_resume_version(checkpoint)
    assert resume == stream_offset(checkpoint, 0)["reservoirVersion"] == 26   # batch 1's start; 0 made the table
    assert stream_offset(checkpoint, 1)["reservoirVersion"] > 40
    assert deltars.trim_log(puts, resume, min_age_s=0) > 0
    assert min(int(n[:20]) for n in os.listdir(os.path.join(puts, "_delta_log")) if n[:20].isdigit()) <= resume
    run_put_stream(spark, puts, checkpoint, out)
    seqs = sorted(r.seq for r in spark.read.format("delta").load(out).select("seq").collect())
    assert seqs == list(range(65))


def test_the_delivery_log_keeps_its_commits_for_the_configured_minutes(spark, tmp_path):
    from pipelines.runner import LOG_RETENTION

    def retention(path: str) -> str | None:
        rows = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
        return {r.key: r.value for r in rows}.get(LOG_RETENTION)

    path = str(tmp_path / "delivery")
    create_delivery_table(spark, path, log_retention_minutes=360)
    assert retention(path) == "interval 360 minutes"
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    create_delivery_table(spark, path, log_retention_minutes=360)    # unchanged: no commit
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == versions
    create_delivery_table(spark, path, log_retention_minutes=60)     # the cluster's setting changed
    assert retention(path) == "interval 60 minutes"
    # Delta will not time travel past the deleted-file retention: it is as long.
    assert {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}[
        "delta.deletedFileRetentionDuration"] == "interval 60 minutes"
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 0
    older = str(tmp_path / "older")                                  # made by a release without it
    create_delivery_table(spark, older)
    assert retention(older) is None
    create_delivery_table(spark, older, log_retention_minutes=360)
    assert retention(older) == "interval 360 minutes"


def test_the_dedup_stream_reads_on_when_a_new_release_sets_the_put_logs_properties(spark, tmp_path):
    """A node of this release opening a PUT log an older one made commits its
    table properties (`storage.tables.PRIMARY_TABLE_PROPERTIES`) while the
    pipeline streams the log: the stream reads every PUT before and after."""
    from deltalake import DeltaTable

    from storage import deltars
    from storage.tables import PRIMARY_TABLE_PROPERTIES, TABLE_PROPERTIES

    puts, checkpoint, out = (str(tmp_path / n) for n in ("puts", "cp", "out"))
    DeltaTable.create(puts, PUTS_SCHEMA, configuration=TABLE_PROPERTIES)   # as an older release made it
    older = deltars.Appender(puts, PUTS_SCHEMA)
    older.table.alter.set_table_properties(TABLE_PROPERTIES | {"delta.deletedFileRetentionDuration":
                                                              "interval 7 days"})
    for seq in range(5):
        append_put(older, seq)
    run_put_stream(spark, puts, checkpoint, out)
    newer = deltars.Appender(puts, PUTS_SCHEMA)   # sets this release's properties: a metadata commit
    assert DeltaTable(puts).metadata().configuration["delta.deletedFileRetentionDuration"] == \
        PRIMARY_TABLE_PROPERTIES["delta.deletedFileRetentionDuration"]
    for seq in range(5, 10):
        append_put(newer, seq)
    run_put_stream(spark, puts, checkpoint, out)
    seqs = sorted(r.seq for r in spark.read.format("delta").load(out).select("seq").collect())
    assert seqs == list(range(10))


def test_the_dedup_holds_a_guid_for_the_window_as_the_express_lane_does(spark, tmp_path):
    """A GUID resent within the history window is dropped; resent after it,
    once a batch before has passed the window, it is delivered again: what
    the express lane (`primary.express.GuidHistory`) decides for the same
    rows. Spark holds a GUID for twice its watermark's delay, so a delay of
    the whole window dropped the resend 1.5 windows on (and the state held
    twice the GUIDs). Spark expires after a batch's rows, so a resend in the
    first batch past the window is still dropped: there the two differ (the
    reconciler's `dedup` disagreement). One PUT commit a micro-batch, times
    in seconds."""
    from pipelines.dedup import start_dedup_query
    from primary.express import GuidHistory
    from storage import deltars
    from storage.tables import PartitionPaths

    window_s = 10
    a, b, c, d, e = (bytes([i]) * 16 for i in range(1, 6))
    commits = [[(0, a), (0, b)], [(4, c)], [(6, a)], [(11, d)], [(13, e)], [(15, a), (15, c)]]
    paths = PartitionPaths(str(tmp_path), 0)
    os.makedirs(os.path.dirname(paths.puts), exist_ok=True)
    appender = deltars.Appender(paths.puts, PUTS_SCHEMA)
    start = dt.datetime(2026, 12, 7, tzinfo=dt.timezone.utc)
    express, kept, seq = GuidHistory(window_us=window_s * 1_000_000), [], 0
    for rows in commits:
        n = len(rows)
        append_puts(appender, seq, [(g, start + dt.timedelta(seconds=s)) for s, g in rows])
        duplicate = express.commit([g for _, g in rows], now_us=rows[0][0] * 1_000_000)
        kept += [seq + i for i in range(n) if not duplicate[i]]
        seq += n
    assert kept == [0, 1, 2, 4, 5, 6, 7]    # a at 6 s is a duplicate; a and c at 15 s are not

    create_delivery_table(spark, paths.delivery)
    query = start_dedup_query(spark, paths, window_s * 1000, available_now=True, max_files_per_trigger=1)
    assert query.awaitTermination(120)
    assert len(query.recentProgress) == len(commits)
    delivered = sorted(r.seq for r in spark.read.format("delta").load(paths.delivery).select("seq").collect())
    # a at 15 s: the batch at 11 s passed its window (0-10 s). c at 15 s:
    # no batch before it passed c's (4-14 s).
    assert delivered == [0, 1, 2, 4, 5, 6]
