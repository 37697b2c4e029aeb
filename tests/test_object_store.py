"""Tables on an S3-compatible object store (issue 19, part 2, in part):
SeaweedFS built from the Go module proxy (`taproot_ops.object_store`). The
primary's appender (delta-rs, put-if-absent through the store's
conditional writes) writes a PUT log there, and Spark reads it over s3a
(hadoop-aws) through `taproot sql` and its views, both from one
`data_dir = "s3://..."`. The lease race tests run against the same store
(`tests/test_leases.py`, their `s3` cases)."""

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
    cluster_file.write_text(f'[cluster]\ndata_dir = "{data_dir}"\n[storage]\nendpoint = "{object_store.endpoint}"\n'
                            "allow_http = true\n")
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "sql", "--config", str(cluster_file), "--json",
                          "SELECT count(*) AS n, max(seq) AS top, first(region) AS region FROM taproot_messages "
                          "WHERE queue = 'on-s3'"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    [row] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert row == {"n": 42, "top": 42, "region": "EU"}
