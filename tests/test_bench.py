"""The load tool: scenario parsing, statistics, the comparison table (unit);
a short real run through the proxy (integration)."""

from __future__ import annotations

import argparse
from array import array

import pytest

from taproot.bench import scenarios_from
from taproot.bench.compare import table
from taproot.bench.report import Samples, percentiles, plot, summarize, sustained_rate
from taproot.bench.runner import STAMP, payload_factory, push_latency_ms
from taproot.bench.scenarios import SCENARIOS, Scenario


def _args(**kw):
    base = dict(scenario=None, size=None, rate=None, duration=None, batch=None, window=None, mode=None, queues=None,
                producers=None, consumers=None)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.unit
def test_scenarios_mirror_blazingmqs_table_and_take_overrides():
    labels = [s.label for s in SCENARIOS.values()]
    assert labels == ["priority 1Q/1P/1C", "priority 10Q/10P/10C", "priority 100Q/100P/100C",
                      "fanout 1Q/1P/5C", "fanout 1Q/1P/30C", "broadcast 1Q/1P/1C", "broadcast 1Q/1P/5C"]
    assert all(s.size == 1024 for s in SCENARIOS.values())
    picked = scenarios_from(_args(scenario=["all"], rate=10_000, duration=3))
    assert len(picked) == 7 and all(s.rate == 10_000 and s.duration_s == 3 for s in picked)
    custom, = scenarios_from(_args(mode="fanout", consumers=3, size=64))
    assert (custom.mode, custom.consumers, custom.size, custom.copies) == ("fanout", 3, 64, 3)
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        scenarios_from(_args(scenario=["nope"]))
    with pytest.raises(ValueError, match="not both"):
        scenarios_from(_args(scenario=["priority-1q"], mode="fanout"))
    with pytest.raises(ValueError, match="mode must be one of"):
        Scenario("x", "topic")
    with pytest.raises(ValueError, match="queues must be at least 1"):
        Scenario("x", queues=0)


@pytest.mark.unit
def test_payloads_carry_their_send_time():
    payload = payload_factory(1024)()
    assert len(payload) == 1024
    sent = STAMP.unpack_from(payload)[0]
    assert push_latency_ms(payload, sent + 2_500_000) == pytest.approx(2.5)


@pytest.mark.unit
def test_statistics_rates_percentiles_and_series():
    acks = Samples(array("d", [100.0 + i / 100 for i in range(101)]), array("d", [float(i) for i in range(101)]))
    assert sustained_rate(acks.times) == pytest.approx(101.0)
    p = percentiles(acks.latency_ms)
    assert (p["p50"], p["p90"], p["p99"], p["max"]) == (50.0, 90.0, 99.0, 100.0)
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}
    result = summarize(acks, Samples(), posted=101, failed={}, start_s=100.0)
    assert (result["acked"], result["received"], result["consume_msg_s"]) == (101, 0, 0.0)
    assert result["series"]["ack"]["rate"] == [100.0, 1.0]  # 100 events in second 0, one at t=1.0


@pytest.mark.unit
def test_comparison_table_gives_taproot_over_peer_ratios():
    def run(system, produce, ack_p99):
        return {"system": system, "label": "priority 1Q/1P/1C", "produce_msg_s": produce, "consume_msg_s": produce,
                "ack_ms": {"p99": ack_p99}, "push_ms": {"p99": None}}
    text = table([run("taproot", 20_000, 40.0), run("nats", 10_000, 20.0)])
    assert "| priority 1Q/1P/1C | nats | 10,000 | 10,000 | 20 | n/a | 2.00 | 2.00 | 2.00 | n/a |" in text


@pytest.mark.integration
def test_a_short_run_acks_and_delivers_everything_and_plots(cluster, tmp_path):
    from taproot.bench.runner import run

    scenario = Scenario("test", "priority", queues=2, rate=400, duration_s=2, size=256)
    result = run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False)
    assert result["failed"] == {} and result["posted"] == result["acked"] > 500
    assert result["received"] == result["expected_received"] == result["acked"]
    assert 0 < result["ack_ms"]["p50"] <= result["ack_ms"]["max"]
    assert result["push_ms"]["p99"] >= result["ack_ms"]["p50"]  # a PUSH follows its ACK
    png = tmp_path / "run.png"
    plot(result, str(png), "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
