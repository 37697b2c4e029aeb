"""Nodes on separate hosts (issue 19, part 3): every role on a host of its
own, each a network namespace with its own address on one switch
(`tests/netns.py`), traffic only between them:

    s3       10.77.0.2   SeaweedFS: the tables (data_dir = s3://...)
    spark    10.77.0.3   a Spark standalone master and worker
    node1-3  10.77.0.11-13   three nodes, three partitions
    proxy1   10.77.0.21  the proxy (node1 first, then the others)
    pipeline 10.77.0.31  the pipeline's driver; its executor runs on `spark`
    client   10.77.0.41  the producer and consumer (`tests/netns_traffic.py`)

The fault suite's invariants (`tests/test_faults.py`: every PUT ACKed once
and as a success, every ACKed message delivered, a CONFIRM made durable
before a fault never undone), with a node's process killed and with a
node's link cut mid-stream, each at 5,000 msg/s; the producer's longest ACK
gap (the failover) under 5 s, and the pipeline on the cluster deciding
every message afterwards. Run alone: `pytest -m hosts`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import store_in_this_process, wait_until
from netns import Network, NetworkUnavailable
from test_faults import FAILOVER_MAX_S, FAULT_AT, MESSAGES, comes_back, queue_on

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.hosts]

HOSTS = {"s3": 2, "spark": 3, "node1": 11, "node2": 12, "node3": 13, "proxy1": 21, "pipeline": 31, "client": 41}
PARTITIONS = 3
CUT_S = 8.0            # how long a cut link stays cut
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def network():
    net = Network()
    try:
        net.start()
    except NetworkUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    try:
        for host, number in HOSTS.items():
            net.add(host, number)
        yield net
    finally:
        net.stop()


@pytest.fixture(scope="module")
def store(network, tmp_path_factory):
    from taproot_ops.object_store import SeaweedFS
    # The roles and the client inherit its settings and credentials from this process.
    with SeaweedFS(tmp_path_factory.mktemp("s3"), host=network.address("s3"),
                   launch_prefix=network.prefix("s3")) as server, store_in_this_process(server):
        yield server


@pytest.fixture(scope="module")
def spark(network, store, tmp_path_factory):
    from taproot_ops.spark_standalone import SparkStandalone
    # Its executors inherit the worker's environment: the store's credentials.
    with SparkStandalone(tmp_path_factory.mktemp("spark"), workers=1, cores=1, memory="2g",
                         host=network.address("spark"), launch_prefix=network.prefix("spark"),
                         env=store.env) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tree(network, store, spark, tmp_path_factory):
    from storage import spark as spark_factory
    from taproot_ops.embedded import EmbeddedCluster

    # The pipeline's host cannot reach Maven Central: the jars are fetched here first.
    spark_factory.fetch_jars(object_store=True)
    conf_dir = tmp_path_factory.mktemp("conf")
    shutil.copytree(TESTS / "ha_conf" / "domains", conf_dir / "domains")
    a = network.address
    nodes = "".join(f'[[nodes]]\nname = "{n}"\nhost = "{a(n)}"\n\n' for n in ("node1", "node2", "node3"))
    (conf_dir / "cluster.toml").write_text(f"""\
[cluster]
name = "hosts"
partitions = {PARTITIONS}
data_dir = "s3://{store.bucket}/{uuid.uuid4().hex[:12]}"
state_dir = "{tmp_path_factory.mktemp('state')}"

{nodes}[[proxies]]
name = "proxy1"
host = "{a('proxy1')}"
upstream = "node1"

[storage]
endpoint = "{store.endpoint}"
allow_http = true

[pipeline]
spark_master = "{spark.master_url}"
driver_host = "{a('pipeline')}"
executor_memory = "1g"
executor_cores = 1
max_cores = 1
trigger_interval_ms = 2000
connect_port = -1        # no test here reads the views (registering them costs 12-30 s of CPU)

[primary]
log_retention_s = 86400   # the durable-CONFIRM check reads the confirm log's history

[ha]
stop_timeout_ms = 10000

[maintenance]
interval_s = 0
""")
    with EmbeddedCluster(str(conf_dir / "cluster.toml"), warm_up=False,
                         launch_prefix=lambda role: network.prefix(role)) as cluster:
        yield cluster


def on_client(network, tree, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*network.prefix("client"), sys.executable, str(TESTS / "netns_traffic.py"), *args,
                           "--data-dir", tree.data_dir, "--partitions", str(PARTITIONS)],
                          capture_output=True, text=True, timeout=timeout_s)


def primary_of(network, tree, partition: int) -> str:
    out = on_client(network, tree, "leases")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)[partition]["holder"]


def run(network, tree, tmp_path, name: str, uri: str, fault) -> dict:
    """The client's traffic through the proxy with `fault()` injected once
    30% of the PUTs are posted; the client's verdict (netns_traffic.py)."""
    control = tmp_path / name
    control.mkdir()
    client = subprocess.Popen([*network.prefix("client"), sys.executable, str(TESTS / "netns_traffic.py"), "traffic",
                               "--hosts", tree.proxy_address, "--uri", uri, "--data-dir", tree.data_dir,
                               "--partitions", str(PARTITIONS), "--control", str(control)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def flowing() -> bool:
            """30% posted and a tenth ACKed: the fault hits a stream that runs."""
            try:
                progress = json.loads((control / "progress.json").read_text())
            except (OSError, ValueError):
                return False
            return progress["posted"] >= MESSAGES * FAULT_AT and progress["acked"] >= MESSAGES / 10
        wait_until(lambda: flowing() or client.poll() is not None, 120, what="the client's traffic to start")
        assert client.poll() is None, client.stdout.read()[-3000:] if client.stdout else ""
        at, wall_us = time.monotonic(), time.time_ns() // 1000
        fault()
        (control / "fault.tmp").write_text(json.dumps({"at": at, "wall_us": wall_us}))
        (control / "fault.tmp").replace(control / "fault.json")
        output, _ = client.communicate(timeout=600)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    result_file = control / "result.json"
    assert result_file.exists(), f"the client ended without a verdict:\n{output[-3000:]}"
    result = json.loads(result_file.read_text())
    print(f"\n[{name}] {json.dumps(result)}")
    assert result["ok"], result.get("error")
    return result


def test_the_pipeline_runs_on_the_cluster(spark, tree):
    [app] = [a for a in spark.state()["activeapps"] if a["name"] == "taproot-pipeline"]
    assert app["state"] == "RUNNING" and app["cores"] == 1


def test_a_killed_primary_on_another_host(network, tree, tmp_path):
    """The primary of the queue's partition loses its process (SIGKILL to
    its host's processes, as a crash would): a node on another host takes
    the partition within the lease, the proxy's clients see one gap."""
    partition = 1
    victim = primary_of(network, tree, partition)
    with comes_back(tree, victim):
        result = run(network, tree, tmp_path, "killed", queue_on(tree, partition, "killed"),
                     lambda: tree.stop_process(victim, signal.SIGKILL))
        assert primary_of(network, tree, partition) != victim
    assert result["outage_s"] < FAILOVER_MAX_S, f"failover took {result['outage_s']:.2f} s"


def test_a_primary_cut_off_the_network(network, tree, tmp_path):
    """The primary's host loses its link (every packet dropped, no reset)
    for 8 s: it can reach neither the store nor its peers; a node on another
    host takes the partition when its lease runs out; when the link comes
    back the cut node is fenced (it never writes for the old epoch again)
    and rejoins as a follower."""
    partition = 2
    victim = primary_of(network, tree, partition)

    def cut() -> None:
        network.cut(victim)
        try:
            time.sleep(CUT_S)
        finally:
            network.mend(victim)

    result = run(network, tree, tmp_path, "cut", queue_on(tree, partition, "cut"), cut)
    assert primary_of(network, tree, partition) != victim
    assert result["outage_s"] < FAILOVER_MAX_S, f"failover took {result['outage_s']:.2f} s"
    assert tree.processes[victim].popen.poll() is None, "the cut node's process ended"
