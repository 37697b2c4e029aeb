"""The peers' own load tools as the comparison reads them
(`taproot_ops.bench.kafka`, `nats_native`, `rabbitmq_native`), how it adds
up several tools run at once, and its tables (`taproot_ops.bench.compare`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from taproot_ops.bench.compare import tables, unavailable
from taproot_ops.bench.native import (
    FANOUT,
    ONE_QUEUE,
    PACED,
    Tool,
    aggregate_rate,
    paced_result,
    together,
    worst_latency,
)

pytestmark = pytest.mark.unit


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

    assert kafka.parse_produced(PRODUCER_OUT) == Tool(500000, 35942.779096, {"p50": 559.0, "p99": 2795.0,
                                                                             "max": 3041.0})
    assert kafka.parse_consumed(CONSUMER_OUT) == Tool(500000, 160256.4103)
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
    assert nats_native.tool(1000)(NATS_CONSUME_OUT) == Tool(1000, 132365.0)
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


def test_tools_run_at_once_are_timed_each_to_its_exit_and_a_failure_says_which():
    code = "import sys, time; time.sleep(float(sys.argv[1])); print(sys.argv[1])"
    tools = together([[sys.executable, "-c", code, "0.1"], [sys.executable, "-c", code, "0.6"]],
                     lambda text: Tool(10, float(text)))
    assert [t.msg_s for t in tools] == [0.1, 0.6]
    assert 0.3 < tools[1].ended - tools[0].ended < 1.5   # each one's own exit, not the last one's
    with pytest.raises(RuntimeError, match="exited with 3: why it failed"):
        together([[sys.executable, "-c", code, "0"],
                  [sys.executable, "-c", "import sys; print('why it failed'); sys.exit(3)"]],
                 lambda text: Tool(1, 1.0))
    with pytest.raises(RuntimeError, match="no summary"):
        together([[sys.executable, "-c", "print('noise')"]], lambda text: (_ for _ in ()).throw(
            RuntimeError("no summary")))


def test_several_tools_rate_is_over_the_union_of_their_windows_not_the_sum_of_their_rates():
    # Two tools of 1,000 messages at 1,000 msg/s: [0, 1] and [0.5, 1.5] overlap, [0, 1] and [9, 10] do not.
    overlapping = [Tool(1000, 1000.0, ended=1.0), Tool(1000, 1000.0, ended=1.5)]
    assert aggregate_rate(overlapping) == pytest.approx(2000 / 1.5)
    apart = [Tool(1000, 1000.0, ended=1.0), Tool(1000, 1000.0, ended=10.0)]
    assert aggregate_rate(apart) == pytest.approx(200.0)
    assert aggregate_rate([Tool(5, 123.0)]) == 123.0
    assert worst_latency([Tool(1, 1.0, {"p50": 2.0, "p99": 9.0}), Tool(1, 1.0, {"p50": 3.0, "p99": 5.0}),
                          Tool(1, 1.0)]) == {"p50": 3.0, "p99": 9.0}
    assert worst_latency([Tool(1, 1.0)]) is None


def test_a_paced_drivers_line_is_read_and_a_run_that_lost_messages_is_an_error():
    line = {"records": 150, "measured": 100, "acked": 150, "errors": 0, "received": 150, "produce_msg_s": 10.0,
            "consume_msg_s": 10.0, "ack_ms": {"p50": 1.0, "p99": 2.0, "max": 3.0}, "push_ms": None}
    assert paced_result("warming up\n" + json.dumps(line) + "\n")["ack_ms"]["p99"] == 2.0
    with pytest.raises(RuntimeError, match="2 sends failed, 148 of 150 received"):
        paced_result(json.dumps({**line, "errors": 2, "received": 148}))
    with pytest.raises(RuntimeError, match="no result"):
        paced_result("Exception in thread main")
    with pytest.raises(RuntimeError, match="not JSON"):
        paced_result('{"records": 150, "cut short')


def _row(system, scenario, label, produce, ack_p99, cpu=None, push=None):
    return {"system": system, "scenario": scenario, "label": label, "durability": "d", "produce_msg_s": produce,
            "consume_msg_s": produce, "ack_ms": {"p50": ack_p99 / 2, "p99": ack_p99}, "push_ms": push,
            "server_cpu_us_per_msg": cpu}


def test_the_comparison_has_a_table_per_scenario_with_ratios_and_says_which_peer_it_could_not_run():
    runs = [_row("kafka", ONE_QUEUE, "1 topic", 60_000, 100.0, cpu=20.0),
            _row("kafka", PACED, "10k msg/s", 10_000, 4.0, push={"p50": 1.0, "p99": 8.0}),
            unavailable("nats", "building nats-server needs the Go toolchain"),
            _row("taproot", ONE_QUEUE, "bulk", 30_000, 400.0, cpu=30.0),
            _row("taproot", PACED, "bulk", 10_000, 60.0, push={"p50": 30.0, "p99": 80.0})]
    text = tables(runs)
    sections = text.split("### ")[1:]
    assert [s.splitlines()[0] for s in sections] == [ONE_QUEUE, PACED]   # none for a scenario nobody ran
    one = sections[0]
    assert "| kafka | 1 topic | d | 60,000 | 60,000 | 50 / 100 |  | 20.0 |" in one
    assert "| taproot | bulk | d | 30,000 | 30,000 | 200 / 400 |  | 30.0 |" in one
    assert "| nats | not available here: building nats-server needs the Go toolchain |" in one
    # Taproot ÷ peer: produce, consume, ACK p50, ACK p99, PUSH p50, PUSH p99, CPU.
    assert "| bulk | kafka, 1 topic, d | 0.50 | 0.50 | 4.00 | 4.00 |  |  | 1.50 |" in one
    paced = sections[1]
    assert "| bulk | kafka, 10k msg/s, d | 1.00 | 1.00 | 15.00 | 15.00 | 30.00 | 10.00 |  |" in paced
    assert "not available here" in paced
    assert FANOUT not in text


def test_compare_runs_its_own_scenarios_and_says_so_when_given_others():
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "bench", "--compare", "--scenario", "priority-1q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--compare runs its own scenarios" in out.stderr and "--compare-python" in out.stderr


def test_a_peer_that_fails_halfway_keeps_the_runs_it_finished_and_says_what_failed(monkeypatch):
    import types

    from taproot_ops.bench import compare
    from taproot_ops.bench.native import PeerUnavailable

    def halfway(seconds, runs):
        runs.append(_row("kafka", ONE_QUEUE, "1 topic", 60_000, 100.0))
        raise RuntimeError("ConsumerPerformance failed: no broker")

    def missing(seconds, runs):
        raise PeerUnavailable("Maven (mvn) is not installed")

    said = {}
    for run_all, expected in ((halfway, ["1 topic", "a run failed after 1 runs"]), (missing, ["not available here"])):
        peer = types.SimpleNamespace(run_all=run_all)
        monkeypatch.setattr(compare.importlib, "import_module", lambda name, peer=peer: peer)
        runs = compare.run_peer("kafka", "kafka", {"seconds": 1.0})
        assert [r["label"] for r in runs] == expected
        said[run_all.__name__] = tables(runs)
    assert "| kafka | a run failed after 1 runs: ConsumerPerformance failed: no broker |" in said["halfway"]
    assert "| kafka | 1 topic |" in said["halfway"]
    assert said["missing"] == "kafka: not available here: Maven (mvn) is not installed"  # no table to put it in
