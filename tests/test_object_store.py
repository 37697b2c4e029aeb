"""Tables on an S3-compatible object store (issue 19, part 2, in part):
SeaweedFS built from the Go module proxy (`taproot_ops.object_store`). The
primary's appender (delta-rs, put-if-absent through the store's
conditional writes) writes a PUT log there, and Spark reads it over s3a
(hadoop-aws) through `taproot sql` and its views, both from one
`data_dir = "s3://..."`. The lease race tests run against the same store
(`tests/test_leases.py`, their `s3` cases). The primary trims its log
there as on a local disk."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

from storage import deltars, tables

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def put_rows(queue: str, count: int, first_seq: int = 1) -> pa.Table:
    now = dt.datetime.now(dt.timezone.utc)
    return pa.Table.from_pylist([{
        "domain": "demo", "queue": queue, "guid": uuid.uuid4().bytes, "seq": first_seq + i,
        "payload": f"m{i}".encode(), "properties": [("region", "EU")], "property_types": [("region", "string")],
        "producer_time": now, "put_time": now, "epoch": 1, "compression": None} for i in range(count)],
        schema=tables.PUTS_SCHEMA)


def test_spark_reads_over_s3a_what_delta_rs_committed_on_the_store(object_store, tmp_path):
    data_dir = f"s3://{object_store.bucket}/{uuid.uuid4().hex[:12]}"
    puts = tables.PartitionPaths(data_dir, 0).puts
    appender = deltars.Appender(puts, tables.PUTS_SCHEMA, epoch=1)
    appender.append(put_rows("on-s3", 40))
    appender.append(put_rows("on-s3", 2, first_seq=41))
    assert deltars.try_open(puts).version() >= 1
    (tmp_path / "domains").mkdir()
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text(f'[cluster]\ndata_dir = "{data_dir}"\nstate_dir = "{tmp_path}/state"\n'
                            f'[storage]\nendpoint = "{object_store.endpoint}"\n'
                            "allow_http = true\n")
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "sql", "--config", str(cluster_file), "--json",
                          "SELECT count(*) AS n, max(seq) AS top, first(region) AS region FROM taproot_messages "
                          "WHERE queue = 'on-s3'"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    [row] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert row == {"n": 42, "top": 42, "region": "EU"}


def test_the_primary_trims_its_log_on_the_store_behind_its_readers(object_store):
    """As on a local disk (tests/test_compaction.py): the log entries before
    the newest checkpoint at or below what a reader needs go, the table and
    its change feed from that version on stay whole."""
    from primary.compaction import Compactor

    path = tables.PartitionPaths(f"s3://{object_store.bucket}/{uuid.uuid4().hex[:12]}", 0).puts
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, epoch=1)
    for i in range(35):
        appender.append(put_rows("trim", 2, first_seq=1 + 2 * i))
    version = deltars.try_open(path).version()
    _, feed = deltars.read_since(deltars.try_open(path), 24, columns=["seq"])   # what a reader resuming at 25 reads
    needed = [None]
    compactor = Compactor(path, every_commits=0, name="s3", log_retention_s=0, log_needed_from=lambda: needed[0])
    assert compactor.trim_log_now() == 0                # what the reader needs is not known: nothing goes
    needed[0] = 25
    assert compactor.trim_log_now() == 20               # commits 0-18 and checkpoint 9
    log_dir = path.removeprefix("s3://") + "/_delta_log"
    from pyarrow import fs
    left = sorted(i.base_name for i in object_store.filesystem().get_file_info(fs.FileSelector(log_dir)))
    assert left[0] == f"{19:020d}.checkpoint.parquet" and f"{version:020d}.json" in left
    table = deltars.try_open(path)
    assert table.version() == version and table.to_pyarrow_table(columns=["seq"]).num_rows == 70
    latest, since = deltars.read_since(table, 24, columns=["seq"])
    assert latest == version and sorted(since["seq"].to_pylist()) == sorted(feed["seq"].to_pylist())
    tail = deltars.LogTail(deltars.try_open(path))       # the primary's tail: on a store, delta-rs reads
    latest, since = tail.read_since(24, columns=["seq"])
    assert latest == version and sorted(since["seq"].to_pylist()) == sorted(feed["seq"].to_pylist())
    assert (tail.read_directly, tail.read_by_delta_rs) == (0, version - 24)
    assert tail.read_since(version, columns=["seq"])[0] == version   # nothing new: a HEAD
    appender.append(put_rows("trim", 2, first_seq=71))   # the writer goes on
    assert deltars.try_open(path).version() == version + 1


def test_a_links_progress_is_kept_beside_its_partition_on_the_store(object_store):
    """Federation's progress file (primary/links.py) where the partition's
    tables are: whichever node leads the partition next reads it there."""
    from primary.links import Progress, progress_path

    path = progress_path(f"s3://{object_store.bucket}/{uuid.uuid4().hex[:12]}", 0, "to-paris")
    assert path.startswith("s3://") and Progress(path).load() is None     # a link that never ran
    Progress(path).save(12, 3400)
    Progress(path).save(13, 3500)                                         # replaced whole
    assert Progress(path).load() == (13, 3500)
    with object_store.filesystem().open_output_stream(path.removeprefix("s3://")) as torn:
        torn.write(b'{"version": 1')
    assert Progress(path).load() == (-1, -1)                              # unreadable: from the log's start
