"""The pipeline's Spark Connect endpoint (issue 22): the Taproot views to a
plain pyspark Connect client with no Taproot code, and `taproot sql` as a
thin client of it. Real node, proxy and pipeline processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from storage.tables import PartitionPaths
from tests.conftest import wait_until
from tests.test_tables import consume, guids_in, post

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# Runs in a subprocess from an empty directory: pyspark only.
CLIENT = """
import json, sys, time
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
query = "SELECT delivered, confirmed, backlog FROM taproot_backlog WHERE domain = 'keep' AND queue = 'connect'"
deadline = time.monotonic() + 60
while True:   # the pipeline registers its views just after it is ready
    try:
        rows = [list(r) for r in spark.sql(query).collect()]
        break
    except AnalysisException:
        if time.monotonic() > deadline:
            raise
        time.sleep(1)
started = time.perf_counter()
again = [list(r) for r in spark.sql(query).collect()]
took = time.perf_counter() - started
print(json.dumps({"rows": rows, "again": again, "second_query_s": took,
                  "taproot_imported": any(m.split(".")[0] in ("taproot", "storage", "conf") for m in sys.modules)}))
"""


def test_a_connect_client_with_no_taproot_code_reads_the_backlog_view(cluster, tmp_path):
    uri = "taproot://keep/connect"
    guids = set(post(cluster.proxy_address, uri, [b"c%d" % i for i in range(5)]))
    got = consume(cluster.proxy_address, uri, 3)  # 3 confirmed; 2 go back when the session closes
    assert len(got) >= 3
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: len(guids_in(paths.confirms) & {m.guid for m in got}) == len(got), 30, what="confirms")
    wait_until(lambda: len(guids_in(paths.delivery) & guids) == 5, 120, interval_s=0.5,
               what="the pipeline's delivery rows")
    assert cluster.connect_url is not None and cluster.connect_url.startswith("sc://127.0.0.1:")
    out = subprocess.run([sys.executable, "-c", CLIENT, cluster.connect_url], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["rows"] == said["again"] == [[5, len(got), 5 - len(got)]]
    assert not said["taproot_imported"]
    print(f"a second query on the endpoint answered in {said['second_query_s'] * 1000:.0f} ms")


def test_taproot_sql_asks_the_endpoint_and_names_the_views_when_one_is_missing(cluster):
    uri = "taproot://keep/connect-sql"
    post(cluster.proxy_address, uri, [b"s%d" % i for i in range(4)], {"region": "EU"})
    cli = [sys.executable, "-m", "taproot_ops.cli", "sql", "--remote", cluster.connect_url]
    query = "SELECT count(*) AS n FROM taproot_puts WHERE queue = 'connect-sql'"
    wait_until(lambda: subprocess.run(cli + ["--json", query], capture_output=True, text=True,
                                      timeout=120).stdout.strip().endswith('{"n":4}'), 90, interval_s=1,
               what="the endpoint's views")
    out = subprocess.run(cli + ["--json", query], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == '{"n":4}', out.stderr[-2000:]
    assert "starting Spark" not in out.stderr   # the endpoint answered: no JVM of its own
    assert "Kernel connector could not" not in out.stderr   # read with Delta's Kernel connector, as by default
    classic = subprocess.run(cli + ["--json", "--classic-reads", query], capture_output=True, text=True, timeout=120)
    assert classic.returncode == 0 and classic.stdout == out.stdout, classic.stderr[-2000:]
    # The pipeline's JVM keeps Netty's JFR events off (`storage.spark.NETTY_JFR_OFF`): their set-up once
    # failed in this endpoint, and every error answer after that broke its stream (the next assertion's).
    jfr = subprocess.run(cli + ["--json", "SELECT reflect('java.lang.System', 'getProperty', 'io.netty.jfr.enabled') "
                                "AS jfr"], capture_output=True, text=True, timeout=120)
    assert jfr.stdout.strip() == '{"jfr":"false"}', jfr.stderr[-2000:]
    missing = subprocess.run(cli + ["SELECT * FROM taproot_nope"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "TABLE_OR_VIEW_NOT_FOUND" in missing.stderr and "taproot_backlog" in missing.stderr


def test_taproot_sql_does_not_use_an_endpoint_that_serves_other_tables(cluster, tmp_path):
    """A config whose data directory is not the one the endpoint's views read:
    `taproot sql` says so and starts a Spark of its own, which PySpark allows
    after the Connect session it asked first (the test stops it once its JVM
    is starting: a local session refused fails at once, with no JVM)."""
    import time

    port = int(cluster.connect_url.rsplit(":", 1)[1])
    (tmp_path / "domains").mkdir()
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text(f'[cluster]\ndata_dir = "{tmp_path}/data"\nstate_dir = "{tmp_path}/state"\n'
                            f"[pipeline]\nconnect_port = {port}\n")
    process = subprocess.Popen([sys.executable, "-m", "taproot_ops.cli", "sql", "--config", str(cluster_file),
                                "SELECT 1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        said = []
        for line in process.stderr:
            said.append(line)
            if line.startswith("starting Spark"):
                break
        time.sleep(3)
        assert process.poll() is None, "".join(said) + process.stderr.read()   # the JVM is starting
    finally:
        process.terminate()
        process.wait(timeout=60)
    assert f"serves {cluster.data_dir}, not {tmp_path}/data: starting a Spark of its own" in "".join(said)


def test_replay_selects_on_the_endpoint_and_posts_in_put_order(cluster):
    """`taproot replay` with the pipeline's endpoint: the pipeline's Spark
    selects and stages the history (no JVM of its own), the CLI posts it."""
    source, target = "taproot://keep/connect-source", "taproot://keep/connect-replayed"
    guids = post(cluster.proxy_address, source, [b"r%d" % i for i in range(6)], {"region": "EU"})
    post(cluster.proxy_address, source, [b"u%d" % i for i in range(3)], {"region": "US"})
    paths = PartitionPaths(cluster.data_dir, 0)
    wait_until(lambda: set(guids) <= guids_in(paths.delivery), 120, interval_s=0.5, what="the source delivered")
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "replay", "--remote", cluster.connect_url,
                          "--hosts", cluster.proxy_address, "--config", str(cluster.config_path),
                          "--data-dir", cluster.data_dir, "--from", source,
                          "--to", target, "--where", "properties['region'] = 'EU'"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "starting Spark" not in out.stderr   # selected on the endpoint
    assert "replayed 6 of 6 selected messages" in out.stdout and "failed: none" in out.stdout, out.stdout
    got = consume(cluster.proxy_address, target, 6)
    assert [m.payload for m in got] == [b"r%d" % i for i in range(6)]   # PUT order
    assert not {m.guid for m in got} & set(guids)                        # new GUIDs
