"""Start-up order does not matter: the node, the proxy, the pipeline and a
client (the SDK) started in any order converge. Every role is started
without waiting for the one before it to be ready; each waits for what it
needs (the SDK for a host with `connect_timeout_s=None`, the proxy for its
upstream, the pipeline for the PUT log a primary creates). Then every PUT is
ACKed once, every message is pushed, and the pipeline, the authority, records
each one in the delivery log.

Three orders run by default, each starting every role before what it
depends on in at least one place; `pytest --long` runs all 24.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_until

from protocol.procstat import stat_fields
from storage import tables
from taproot_ops.embedded import free_port

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROLES = ("sdk", "proxy", "pipeline", "node")
SHORT = [("sdk", "proxy", "pipeline", "node"),    # each before everything it needs
         ("pipeline", "sdk", "node", "proxy"),
         ("node", "sdk", "pipeline", "proxy")]
MESSAGES = 300
GAP_S = 1.5         # between two roles' starts


def nice_of(pid: int) -> int:
    fields = stat_fields(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[16])     # field 19 of /proc/<pid>/stat; stat_fields starts at field 3


def children_of(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def orders(config) -> list[tuple[str, ...]]:
    return list(itertools.permutations(ROLES)) if config.getoption("--long") else SHORT


def pytest_generate_tests(metafunc):
    if "order" in metafunc.fixturenames:
        chosen = orders(metafunc.config)
        metafunc.parametrize("order", chosen, ids=["-".join(o) for o in chosen])


class Client:
    """A producer and a consumer on one session, started before anything
    may answer: its `start()` waits for the proxy as long as it takes."""

    def __init__(self, address: str, uri: str):
        from taproot import Session
        self.session = Session([address], connect_timeout_s=None)
        self.uri = uri
        self.acks: list = []
        self.received: list[bytes] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            self.session.start()
            consumer = self.session.open_queue(self.uri, read=True, timeout_s=240)
            producer = self.session.open_queue(self.uri, write=True, timeout_s=240)
            futures = [producer.post(b"%04d" % i) for i in range(MESSAGES)]
            for future in futures:
                future.result(timeout=120)
                self.acks.append(future.guid)
            deadline = time.monotonic() + 120
            while len(self.received) < MESSAGES and time.monotonic() < deadline:
                message = consumer.get(timeout_s=0.5)
                if message is not None:
                    self.received.append(message.guid)
                    consumer.confirm(message)
        except BaseException as exc:  # reported by the test
            self.error = exc


def delivered_guids(data_dir: str) -> set[bytes]:
    from deltalake import DeltaTable
    path = tables.PartitionPaths(data_dir, 0).delivery
    try:
        return set(DeltaTable(path).to_pyarrow_table(columns=["guid"])["guid"].to_pylist())
    except Exception:  # not created yet
        return set()


def test_roles_started_in_any_order_converge(order, tmp_path):
    from taproot_ops.embedded import EmbeddedCluster
    # The shared test cluster's configuration without the Spark Connect
    # endpoint: no shipped port taken, and no views registered (12-30 s of CPU).
    conf_dir = tmp_path / "conf"
    shutil.copytree(Path(__file__).resolve().parent / "cluster_conf", conf_dir)
    conf_file = conf_dir / "cluster.toml"
    conf_file.write_text(conf_file.read_text().replace("[pipeline]\n", "[pipeline]\nconnect_port = -1\n", 1))
    node_port, proxy_port = free_port(), free_port()
    cluster = EmbeddedCluster(str(conf_file), data_dir=str(tmp_path / "data"))
    node = cluster.config.nodes[0].name
    cluster.node_addresses[node] = f"127.0.0.1:{node_port}"   # known before the node runs
    client = Client(f"127.0.0.1:{proxy_port}", "taproot://demo/start-order")
    start = {
        "sdk": client.start,
        "proxy": lambda: cluster.start_proxy(port=proxy_port, hosts=[cluster.node_addresses[node]], wait=False),
        "pipeline": lambda: cluster.start_pipeline(warm_up=False, wait=False),
        "node": lambda: cluster.start_node(port=node_port, name=node, wait=False),
    }
    try:
        for role in order:
            start[role]()
            time.sleep(GAP_S)
        client.thread.join(400)
        assert not client.thread.is_alive(), "the client never finished"
        assert client.error is None, repr(client.error)
        assert len(client.acks) == MESSAGES == len(set(client.acks))
        assert set(client.received) == set(client.acks), f"{len(set(client.received))} of {MESSAGES} pushed"
        for name, process in cluster.processes.items():
            assert process.popen.poll() is None, f"{name} exited with {process.popen.returncode}"
        cluster.processes["pipeline"].wait_ready(180)
        pipeline = cluster.processes["pipeline"].popen.pid
        # The shipped `[pipeline] cpu_nice`: the pipeline and its Spark JVM yield the CPU to the others.
        ours = os.nice(0)
        assert [nice_of(pid) for pid in (pipeline, *children_of(pipeline))] == [max(19, ours)] * 2
        assert nice_of(cluster.processes[node].popen.pid) == ours
        wanted = set(client.acks)
        wait_until(lambda: wanted <= delivered_guids(cluster.data_dir), 180,
                   what="the pipeline to record every message in the delivery log")
    finally:
        client.session.stop(timeout_s=2)
        cluster.stop()
