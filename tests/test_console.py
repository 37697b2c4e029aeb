"""What commands say while they work (`taproot_ops.console`), and a
command that checks what it needs before it starts (`bench --compare`)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from taproot_ops import console

pytestmark = pytest.mark.unit

CONSOLE = Path(console.__file__)


def test_a_wait_without_a_terminal_says_what_it_waits_for_and_how_long_it_took(monkeypatch):
    out = io.StringIO()
    with console.Waiting("fetching jars", usually_s=60, stream=out) as waiting:
        waiting.note("3 of 5")
    lines = out.getvalue().splitlines()
    assert lines[0] == "   fetching jars (usually about 60 s)..."
    assert lines[-1].startswith("   fetching jars: done in 0 s, 3 of 5")
    assert "\r" not in out.getvalue()


def test_a_wait_that_fails_or_is_interrupted_says_so():
    out = io.StringIO()
    with pytest.raises(ValueError):
        with console.Waiting("x", stream=out):
            raise ValueError("no")
    with pytest.raises(KeyboardInterrupt):
        with console.Waiting("y", stream=out):
            raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-3:] == ["   x: failed after 0 s", "   y...", "   y: interrupted after 0 s"]


def test_a_line_said_during_a_live_wait_goes_above_it(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    with console.Waiting("building", stream=out):
        console.say("a role logged an error", out)
    text = out.getvalue()
    said = text.index("a role logged an error\n")
    # The live line is cleared before the line and drawn again after it.
    assert text.rindex("\r", 0, said) < said and "| building: 0 s" in text[said:]
    assert text.endswith("building: done in 0 s\n")


def test_a_logged_step_keeps_the_tools_output_in_the_log_and_shows_its_end_when_it_fails(tmp_path):
    log = tmp_path / "setup.log"
    ok = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "step one", "--",
                         sys.executable, "-c", "print('noise ' * 5)"], capture_output=True, text=True)
    assert ok.returncode == 0 and "noise" not in ok.stdout + ok.stderr
    assert "step one: done in" in ok.stdout and "noise noise" in log.read_text()
    bad = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "step two", "--",
                          sys.executable, "-c", "import sys; print('why it failed'); sys.exit(3)"],
                         capture_output=True, text=True)
    assert bad.returncode == 3
    assert "why it failed" in bad.stderr and f"step two failed (exit 3); its whole output is in {log}" in bad.stderr
    assert "step two: failed after 0 s" in bad.stdout
    usage = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "x"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and "no command given" in usage.stderr and "Traceback" not in usage.stderr


def test_without_a_terminal_taking_the_foreground_is_a_no_op():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from taproot_ops.console import Terminal; "
            "t = Terminal(); print(t.take()); t.restore()")
    out = subprocess.run([sys.executable, "-c", code, str(CONSOLE.parents[1])], capture_output=True, text=True,
                         start_new_session=True)   # no controlling terminal
    assert out.stdout.strip() == "False", out.stderr


def test_bench_compare_checks_the_peers_clients_before_it_starts(monkeypatch):
    from taproot_ops.bench import peers

    monkeypatch.setattr(peers, "ensure_installed", lambda system: None)
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(peers.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for pika>=1.3"))
    with pytest.raises(peers.PeerSetupError) as raised:
        peers.prepare("rabbitmq")
    said = str(raised.value)
    assert "No matching distribution" in said and "-m pip install 'pika>=1.3'" in said


# What Kafka's own load tools printed here (4.2.0), as taproot_ops.bench.kafka reads it.
PRODUCER_OUT = """47236 records sent, 9443.4 records/sec (9.22 MB/sec), 2073.4 ms avg latency, 3041.0 ms max latency.
500000 records sent, 35942.779096 records/sec (35.10 MB/sec), 797.83 ms avg latency, 3041.00 ms max latency, \
559 ms 50th, 2134 ms 95th, 2795 ms 99th, 3012 ms 99.9th.
"""
CONSUMER_OUT = """start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, \
rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-25 05:58:00:603, 2026-11-25 05:58:03:723, 488.2813, 156.5004, 500000, 160256.4103, 943, 2177, 224.2909, \
229673.8631
"""
END_TO_END_OUT = "0\t169.162893\nAvg latency: 5.7082 ms\nPercentiles: 50th = 4, 99th = 14, 99.9th = 169\n"


def test_kafkas_tools_are_read_from_their_summaries():
    from taproot_ops.bench import kafka

    produced = kafka.parse_produced(PRODUCER_OUT)
    assert produced == {"records": 500000, "msg_s": 35942.779096, "ack_ms": {"p50": 559.0, "p99": 2795.0,
                                                                            "max": 3041.0}}
    assert kafka.parse_consumed(CONSUMER_OUT) == 160256.4103
    assert kafka.parse_end_to_end(END_TO_END_OUT) == {"p50": 4.0, "p99": 14.0}
    for parse in (kafka.parse_produced, kafka.parse_consumed, kafka.parse_end_to_end):
        with pytest.raises(RuntimeError):
            parse("Exception in thread main: no broker")
    assert len(kafka._cluster_id()) == 22


NATS_PUB_OUT = ("NATS JetStream asynchronous publisher stats: 107,556 msgs/sec ~ 105 MiB/sec ~ min: 2,614.71us ~ "
                "avg: 4,644.05us ~ max: 21,462.37us ~ P50: 4,174.37us ~ P90: 6,646.07us ~ P99: 11,789.28us ~ "
                "P99.9: 21,462.37us\n")
NATS_CONSUME_OUT = "NATS JetStream durable consumer (callback) stats: 132,365 msgs/sec ~ 129 MiB/sec\n"


def test_nats_bench_is_read_from_its_stats_line():
    from taproot_ops.bench import nats_native

    assert nats_native.parse_stats(NATS_PUB_OUT) == {"msg_s": 107556.0, "ack_ms": {"p50": pytest.approx(4.17437),
                                                                                 "p99": pytest.approx(11.78928)}}
    assert nats_native.parse_stats(NATS_CONSUME_OUT) == {"msg_s": 132365.0, "ack_ms": None}
    with pytest.raises(RuntimeError):
        nats_native.parse_stats("nats: error: no servers available for connection")


PERF_TEST_OUT = """test stopped (Reached time limit)
id: test-062120-918, sending rate avg: 14317 msg/s
id: test-062120-918, receiving rate avg: 14317 msg/s
id: test-062120-918, consumer latency min/median/75th/95th/99th 650/23559/35030/61139/81547 µs
id: test-062120-918, confirm latency min/median/75th/95th/99th 454/16179/22967/38143/55231 µs
"""


def test_rabbitmq_perf_test_is_read_from_its_summary():
    from taproot_ops.bench import rabbitmq_native

    summary = rabbitmq_native.parse_summary(PERF_TEST_OUT)
    assert summary["produce_msg_s"] == 14317.0 and summary["consume_msg_s"] == 14317.0
    assert summary["ack_ms"] == {"p50": pytest.approx(16.179), "p99": pytest.approx(55.231)}
    assert summary["push_ms"] == {"p50": pytest.approx(23.559), "p99": pytest.approx(81.547)}
    with pytest.raises(RuntimeError):
        rabbitmq_native.parse_summary("Main thread caught exception: connection refused")
