"""Liveness by heartbeat: a client (the SDK) that hears nothing at all from
its host for PEER_SILENCE_MAX_MS leaves it for the next one. gRPC's keepalive
is switched off here, so only the heartbeats can notice: the host sits
behind a TCP relay that stops forwarding, connections open, nothing moving."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from tcp_relay import StallableRelay

import taproot.session
from protocol.limits import PEER_SILENCE_MAX_MS
from protocol.stream import GRPC_OPTIONS

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from taproot_ops.embedded import EmbeddedCluster
    conf_file = Path(__file__).resolve().parent / "cluster_conf" / "cluster.toml"
    with EmbeddedCluster(str(conf_file), data_dir=str(tmp_path_factory.mktemp("data")), ephemeral_ports=True,
                         with_pipeline=False, with_proxy=False) as cluster:
        yield cluster.node_address


def test_a_host_that_goes_silent_is_left_for_the_next_by_heartbeat(node, monkeypatch, caplog):
    from taproot import Session
    monkeypatch.setattr(taproot.session, "GRPC_OPTIONS", [o for o in GRPC_OPTIONS if "keepalive" not in o[0]])
    host, port = node.rsplit(":", 1)
    relay = StallableRelay((host, int(port)))
    caplog.set_level(logging.WARNING, logger="taproot.session")
    try:
        with Session([relay.address, node]) as session:
            producer = session.open_queue("taproot://demo/liveness", write=True)
            for future in [producer.post(b"before") for _ in range(10)]:
                future.result(timeout=10)
            assert session.host == relay.address
            relay.stall()
            started = time.monotonic()
            futures = [producer.post(b"during") for _ in range(10)]
            for future in futures:
                future.result(timeout=20)
            took = time.monotonic() - started
            assert session.host == node and session.reconnects == 1
            assert "silent for" in caplog.text
            assert took < PEER_SILENCE_MAX_MS / 1000 + 2.5, f"left the silent host after {took:.1f} s"
    finally:
        relay.resume()
        relay.close()
