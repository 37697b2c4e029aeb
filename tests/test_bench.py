"""The load tool: scenario parsing, statistics, the comparison table (unit);
a short real run through the proxy (integration)."""

from __future__ import annotations

import argparse
import os
import tempfile
from array import array

import pytest

from taproot_ops.bench import scenarios_from
from taproot_ops.bench.compare import table
from taproot_ops.bench.report import Samples, percentiles, plot, rss_by_minute, summarize, sustained_rate
from taproot_ops.bench.runner import STAMP, Shared, payload_factory, push_latency_ms
from taproot_ops.bench.scenarios import QUEUE_SWEEP, SCENARIOS, Scenario
from taproot_ops.bench.taproot_driver import sessions_of


def _args(**kw):
    base = dict(scenario=None, size=None, rate=None, duration=None, batch=None, window=None, mode=None, queues=None,
                producers=None, consumers=None, queues_per_client=None)
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
def test_the_queue_sweep_keeps_four_clients_and_spreads_queues_over_them():
    picked = scenarios_from(_args(scenario=["queues"], duration=3))
    assert [s.queues for s in picked] == [1, 10, 100, 1000, 10_000]
    assert all((s.sessions(s.producers), s.sessions(s.consumers)) == (2, 2) for s in picked)
    assert QUEUE_SWEEP["queues-10000"].label == "priority 10000Q/2P/2C (5000 queues per client)"
    # The runner spreads (queue, n) clients over workers; each worker's
    # driver groups them into sessions of `queues_per_client` queues.
    scenario = Scenario("x", queues=7, queues_per_client=3, producers=2)
    worker = [(q, n) for q in range(7) for n in range(2)][0::2]   # one of two workers
    sessions = sessions_of(scenario, worker)
    assert sessions == [((0, 1, 2), 0), ((3, 4, 5), 0), ((6,), 0)]
    assert sessions_of(Scenario("y", queues=2), [(0, 0), (1, 0)]) == [((0,), 0), ((1,), 0)]
    custom, = scenarios_from(_args(mode="priority", queues=50, queues_per_client=25))
    assert custom.sessions(1) == 2
    with pytest.raises(ValueError, match="queues_per_client must be at least 1"):
        Scenario("x", queues_per_client=0)


@pytest.mark.unit
def test_cpu_probe_counts_a_process_and_its_children(tmp_path):
    import subprocess
    import sys
    import time

    from taproot_ops.bench.cpu import delta, tree_cpu_seconds

    # A parent whose child burns about 0.3 s of CPU: the parent's tree has it.
    child = tmp_path / "child.py"
    child.write_text("import time\nt = time.process_time()\n"
                     "while time.process_time() - t < 0.3:\n    pass\ntime.sleep(5)\n")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, {str(child)!r}])"])
    try:
        before = tree_cpu_seconds({"parent": parent.pid})
        for _ in range(100):
            used = delta(before, tree_cpu_seconds({"parent": parent.pid, "gone": 2 ** 22 + 7}))
            if used.get("parent", 0) >= 0.25:
                break
            time.sleep(0.05)
        assert used["parent"] >= 0.25 and "gone" not in used
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.unit
def test_proc_stat_gives_state_and_parent_and_a_zombie_is_not_alive():
    import os
    import subprocess
    import sys
    import time

    from primary.server import _alive
    from protocol.procstat import stat_fields

    assert stat_fields(os.getpid())[1] == str(os.getppid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # exited, not reaped yet: a zombie
        if stat_fields(child.pid)[0] == "Z":
            break
        time.sleep(0.01)
    assert not _alive(child.pid)
    child.wait()
    assert stat_fields(child.pid) is None and not _alive(child.pid)
    assert _alive(os.getpid())


@pytest.mark.unit
def test_a_data_dir_that_cannot_be_one_is_a_clear_error_not_a_traceback(tmp_path):
    import subprocess
    import sys

    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    run = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "bench", "--scenario", "priority-1q",
                          "--duration", "1", "--data-dir", str(not_a_dir)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})   # no other run's tidy to wait out
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"data directory {not_a_dir} cannot be used" in run.stderr and "Not a directory" in run.stderr
    assert "logs are in" not in run.stdout      # no pointer to logs that cannot exist


@pytest.mark.unit
@pytest.mark.parametrize("scenario, extra, says", [
    ("priority-1q", ["--no-pipeline", "--spark-cluster"], "--no-pipeline runs no Spark"),
    ("priority-1q", ["--no-pipeline", "--sql-every", "5"], "--no-pipeline runs no Spark"),
    ("priority-1q", ["--config", "conf/cluster.toml"], "--config is read with --replay"),
    ("priority-1q", ["--hosts", "127.0.0.1:1", "--no-pipeline"], "--no-pipeline shapes the embedded cluster"),
    ("priority-1q", ["--hosts", "127.0.0.1:1", "--tls", "--spark-cluster", "--data-dir", "d"],
     "--tls, --spark-cluster, --data-dir shape the embedded cluster"),
    ("federation-push", ["--no-pipeline"], "federation scenarios .* take no --no-pipeline"),
    ("federation-push", ["--object-store", "--sql-every", "5"], "take no --object-store, --sql-every"),
    ("priority-1q", ["--hosts", "127.0.0.1:1", "--set", "primary.compact_every_commits=0"],
     "--set shapes the embedded cluster"),
    ("federation-push", ["--set", "primary.compact_every_commits=0"], "take no --set")])
def test_options_the_embedded_cluster_cannot_follow_are_a_clear_error(scenario, extra, says):
    from taproot_ops import bench, cli

    args = cli.build_parser().parse_args(["bench", "--scenario", scenario, *extra])
    with pytest.raises(SystemExit, match=says):
        bench._run_taproot(scenarios_from(args), args, None)


@pytest.mark.unit
def test_the_load_generators_collector_setting_is_checked():
    from taproot_ops import cli
    from taproot_ops.bench.runner import run

    assert cli.build_parser().parse_args(["bench"]).client_gc == "tuned"
    assert cli.build_parser().parse_args(["bench", "--client-gc", "default"]).client_gc == "default"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--client-gc", "off"])
    with pytest.raises(ValueError, match="client_gc must be one of tuned, default, not 'off'"):
        run("taproot", "127.0.0.1:1", Scenario("x"), client_gc="off")


@pytest.mark.unit
def test_malloc_default_switches_the_tuning_off_for_every_process_the_bench_starts(monkeypatch, capsys):
    from protocol import malloc_tuning
    from taproot_ops import bench, cli

    monkeypatch.setenv(malloc_tuning.SWITCH, "on")   # and gone again after the test
    assert cli.build_parser().parse_args(["bench"]).malloc == "tuned"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", "--malloc", "off"])
    # A scenario it does not know ends the run before anything starts, after the switch is set.
    assert bench.main(cli.build_parser().parse_args(["bench", "--scenario", "no-such"])) == 2
    assert not malloc_tuning.switched_off()
    assert bench.main(cli.build_parser().parse_args(["bench", "--malloc", "default", "--scenario", "no-such"])) == 2
    assert os.environ[malloc_tuning.SWITCH] == "off" and malloc_tuning.switched_off()
    assert "no-such" in capsys.readouterr().err


def test_payloads_carry_their_send_time():
    payload = payload_factory(1024)()
    assert len(payload) == 1024
    sent = STAMP.unpack_from(payload)[0]
    assert push_latency_ms(payload, sent + 2_500_000) == pytest.approx(2.5)


@pytest.mark.unit
def test_a_paced_producer_sleeps_only_when_a_millisecond_ahead_and_holds_its_rate():
    from taproot_ops.bench.runner import MIN_SLEEP_S, pacing_delay

    assert pacing_delay(0.0, 0, 10_000, 0.0) == 0.0             # behind or on time: post
    assert pacing_delay(0.0, 5, 10_000, 0.0) == 0.0             # 0.5 ms ahead: post
    assert pacing_delay(0.0, 20, 10_000, 0.0) == pytest.approx(0.002)
    # A producer on a simulated clock: each post costs 20 us, each sleep
    # lasts what it asked. Over 2 s at 10k msg/s it posts 20,000 messages
    # (the rate holds), is never more than MIN_SLEEP_S ahead of schedule
    # when it posts, and sleeps about once a millisecond, not once a message.
    for rate in (10_000, 1_000, 50):
        now, posted, sleeps = 0.0, 0, 0
        while now < 2.0:
            delay = pacing_delay(0.0, posted, rate, now)
            if delay:
                sleeps += 1
                now += delay
                continue
            assert posted / rate - now < MIN_SLEEP_S
            posted += 1
            now += 20e-6
        assert abs(posted - 2 * rate) <= max(2, rate * MIN_SLEEP_S + 1)
        assert sleeps <= 2.0 / MIN_SLEEP_S + 1 and sleeps <= posted


@pytest.mark.unit
def test_receipts_of_many_queues_reported_at_once_add_to_each_queue_and_to_the_progress_line():
    import multiprocessing as mp

    from taproot_ops.bench.runner import Shared

    ctx = mp.get_context("fork")   # the arrays' shared memory inherited, as the bench's workers map it
    queues = 50
    shared = Shared(ctx.Value("i", 0), ctx.Value("d", 0.0), ctx.Event(), ctx.Array("q", queues),
                    ctx.Array("q", 3), ctx.Array("q", queues), 10.0, ctx.Value("i", 0), ctx.Array("q", queues),
                    ctx.Value("i", 0))
    shared.add_received_many({})          # nothing to report: nothing changes
    shared.add_received(7, 2)
    assert list(shared.progress) == [0, 2, 0] and shared.received[7] == 2

    # Three consumer processes reporting at once: no receipt is lost under the locks.
    workers = [ctx.Process(target=_report_receipts, args=(shared, k * 13, queues)) for k in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    rounds = _RECEIPT_ROUNDS
    assert list(shared.progress) == [3 * rounds, 2 + 9 * rounds, 0]
    expected = [0] * queues
    expected[7] = 2
    for k in range(3):
        for n in range(rounds):
            expected[(k * 13 + n) % queues] += 1
            expected[(k * 13 + n + 1) % queues] += 2
    assert list(shared.received) == expected


_RECEIPT_ROUNDS = 20_000


def _report_receipts(shared: Shared, offset: int, queues: int) -> None:
    for n in range(_RECEIPT_ROUNDS):
        shared.add_received_many({(offset + n) % queues: 1, (offset + n + 1) % queues: 2})
        shared.add_progress(acked=1)


@pytest.mark.unit
def test_the_servers_cpu_clock_stops_when_everything_is_delivered_not_after_the_producers_close_their_queues():
    import multiprocessing as mp

    from taproot_ops.bench.runner import Shared, _all_delivered

    ctx = mp.get_context("spawn")
    shared = Shared(ctx.Value("i", 0), ctx.Value("d", 0.0), ctx.Event(), ctx.Array("q", 2), ctx.Array("q", 3),
                    ctx.Array("q", 2), 10.0, ctx.Value("i", 0), ctx.Array("q", 2), ctx.Value("i", 0))
    shared.add_progress(acked=100)
    shared.add_progress(received=200)   # two copies each (fanout)
    # Two (queue, producer) pairs: one answered is not all.
    shared.mark_producers_answered(1)
    assert not _all_delivered(shared, [0, 0], producers=2, copies=2, answers_signalled=True)
    shared.mark_producers_answered(1)
    assert _all_delivered(shared, [0, 0], producers=2, copies=2, answers_signalled=True)
    assert not _all_delivered(shared, [0, 0], producers=2, copies=3, answers_signalled=True)   # a copy missing
    # A driver that does not signal: only once the producers' results are in.
    assert not _all_delivered(shared, [0, 0], producers=2, copies=2, answers_signalled=False)
    shared.producers_done.set()
    assert _all_delivered(shared, [60, 40], producers=2, copies=2, answers_signalled=False)
    assert not _all_delivered(shared, [60, 41], producers=2, copies=2, answers_signalled=False)


@pytest.mark.unit
def test_the_authoritys_cpu_line_says_how_much_of_it_the_clients_closes_took(capsys):
    from taproot_ops.bench import print_result

    ms = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0}
    result = {"system": "taproot", "label": "x", "failed": {}, "produce_msg_s": 1.0, "consume_msg_s": 1.0,
              "acked": 10, "posted": 10, "received": 10, "expected_received": 10, "ack_ms": ms, "push_ms": ms,
              "authority": {"lag_ms": ms, "rows": 10, "expected": 10, "waited_s": 1.0, "disagreements": 0,
                            "cpu_s": {"node1": 30.5, "pipeline": 20.7}, "cpu_us_per_msg": 297.0}}
    for closes, says in (({"node1": 12.5, "pipeline": 0.4}, "the clients' queue closes after the run took node1 "
                          "12.5 s, pipeline 0.4 s of it"), ({"node1": 0.1}, None), (None, None)):
        print_result({**result, "cpu_closes_s": closes})
        line = next(x for x in capsys.readouterr().out.splitlines() if "until the authority caught up" in x)
        assert "297 us per message" in line
        assert (says in line) if says else "closes" not in line


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
def test_the_authority_lag_by_minute_of_the_puts_shows_whether_it_falls_behind():
    import datetime as dt

    import pyarrow as pa

    from taproot_ops.bench.authority import by_minute, lag_ms

    start = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)
    puts = [start + dt.timedelta(seconds=s) for s in (0, 30, 59, 60, 119, 130)]
    lags = [1, 3, 2, 10, 30, 7]             # seconds: the second minute fell behind, the third caught up
    rows = pa.table({"put_time": pa.array(puts, pa.timestamp("us", tz="UTC")),
                     "delivered_time": pa.array([p + dt.timedelta(seconds=g) for p, g in zip(puts, lags)],
                                                pa.timestamp("us", tz="UTC"))})
    minutes = by_minute(rows["put_time"], lag_ms(rows), start.timestamp())
    assert minutes["t"] == [0.0, 60.0, 120.0]
    assert minutes["max"] == [3000.0, 30000.0, 7000.0] and minutes["p50"][0] == 2000.0
    empty = rows.slice(0, 0)
    assert by_minute(empty["put_time"], lag_ms(empty), start.timestamp()) == {
        "t": [], "rate": [], "p50": [], "p99": [], "max": []}


@pytest.mark.unit
def test_put_ack_phases_are_means_over_the_run_from_two_scrapes():
    from taproot_ops.bench.phases import frames_a_message, fsyncs, group_commits, means_ms, slow_shares, totals_of

    def scraped(to_node, group, commit, count):
        lines = ["# TYPE taproot_put_ack_phase_seconds histogram"]
        for phase, total in (("to_node", to_node), ("group", group), ("commit", commit)):
            # Of every 100 messages, 1 to the node, 2 waiting and 3 in the commit took over 50 ms.
            within = count - count * {"to_node": 1, "group": 2, "commit": 3}[phase] // 100
            lines += [f'taproot_put_ack_phase_seconds_bucket{{le="0.025",phase="{phase}"}} {count // 2}',
                      f'taproot_put_ack_phase_seconds_bucket{{le="0.05",phase="{phase}"}} {within}',
                      f'taproot_put_ack_phase_seconds_bucket{{le="0.1",phase="{phase}"}} {count}',
                      f'taproot_put_ack_phase_seconds_bucket{{le="+Inf",phase="{phase}"}} {count}',
                      f'taproot_put_ack_phase_seconds_count{{phase="{phase}"}} {count}',
                      f'taproot_put_ack_phase_seconds_sum{{phase="{phase}"}} {total}']
        # Each node's Session streams: `count` messages in, carrying twice as
        # many frames, and as many out as in, one frame each.
        lines += ["# TYPE taproot_stream_messages_total counter",
                  f'taproot_stream_messages_total{{direction="in"}} {count}',
                  f'taproot_stream_messages_total{{direction="out"}} {count}',
                  "# TYPE taproot_stream_frames_total counter",
                  f'taproot_stream_frames_total{{direction="in"}} {2 * count}',
                  f'taproot_stream_frames_total{{direction="out"}} {count}']
        # Each node's fsyncs: as many as messages, a tenth of them over 10 ms.
        lines += ["# TYPE taproot_fsync_seconds histogram",
                  f'taproot_fsync_seconds_bucket{{le="0.005"}} {count // 2}',
                  f'taproot_fsync_seconds_bucket{{le="0.01"}} {count - count // 10}',
                  f'taproot_fsync_seconds_bucket{{le="+Inf"}} {count}',
                  f"taproot_fsync_seconds_count {count}",
                  f"taproot_fsync_seconds_sum {count * 0.002 * (1 + count // 200)}"]
        # Each node's group commits: a tenth as many PUT commits as messages,
        # and a fiftieth as many CONFIRM commits of all the messages.
        lines += ["# TYPE taproot_group_commit_messages histogram"]
        for log, commits in (("puts", count // 10), ("confirms", count // 50)):
            lines += [f'taproot_group_commit_messages_bucket{{le="+Inf",log="{log}",partition="0"}} {commits}',
                      f'taproot_group_commit_messages_count{{log="{log}",partition="0"}} {commits}',
                      f'taproot_group_commit_messages_sum{{log="{log}",partition="0"}} {count}']
        return "\n".join(lines) + "\n"

    # Two nodes add up; the run is what moved between the scrapes.
    before: dict = {}
    totals_of(scraped(1.0, 2.0, 0.5, 100), before)
    after: dict = {}
    totals_of(scraped(1.0, 2.0, 0.5, 100), after)
    totals_of(scraped(3.0, 4.0, 1.5, 200), after)
    means = means_ms({k: tuple(v) for k, v in before.items()}, {k: tuple(v) for k, v in after.items()})
    assert means == {"to_node": pytest.approx(15.0), "group": pytest.approx(20.0), "commit": pytest.approx(7.5)}
    assert slow_shares({k: tuple(v) for k, v in before.items()}, {k: tuple(v) for k, v in after.items()}) == {
        "to_node": pytest.approx(0.01), "group": pytest.approx(0.02), "commit": pytest.approx(0.03)}
    assert slow_shares({k: tuple(v) for k, v in after.items()}, {k: tuple(v) for k, v in after.items()}) == {}
    # Nothing ACKed in between: no means rather than a division by zero.
    assert means_ms({k: tuple(v) for k, v in after.items()}, {k: tuple(v) for k, v in after.items()}) == {}
    # Frames a gRPC message over the run, both nodes together.
    assert frames_a_message({k: tuple(v) for k, v in before.items()}, {k: tuple(v) for k, v in after.items()}) \
        == {"in": pytest.approx(2.0), "out": pytest.approx(1.0)}
    assert frames_a_message({k: tuple(v) for k, v in after.items()}, {k: tuple(v) for k, v in after.items()}) == {}
    # The run's 200 fsyncs took 4 ms each (the second node's sum), a tenth over 10 ms; they are no phase.
    assert fsyncs({k: tuple(v) for k, v in before.items()}, {k: tuple(v) for k, v in after.items()}) == {
        "count": 200, "mean_ms": pytest.approx(4.0), "slow_share": pytest.approx(0.1)}
    assert fsyncs({k: tuple(v) for k, v in after.items()}, {k: tuple(v) for k, v in after.items()}) == {}
    # The run's 200 messages in 20 PUT commits of 10 and 4 CONFIRM commits of 50; they are no phase either.
    assert group_commits({k: tuple(v) for k, v in before.items()}, {k: tuple(v) for k, v in after.items()}) == {
        "puts": {"count": 20, "messages": pytest.approx(10.0)},
        "confirms": {"count": 4, "messages": pytest.approx(50.0)}}
    assert group_commits({k: tuple(v) for k, v in after.items()}, {k: tuple(v) for k, v in after.items()}) == {}


@pytest.mark.unit
def test_comparison_table_gives_taproot_over_peer_ratios():
    def run(system, produce, ack_p99):
        return {"system": system, "label": "priority 1Q/1P/1C", "produce_msg_s": produce, "consume_msg_s": produce,
                "ack_ms": {"p99": ack_p99}, "push_ms": {"p99": None}}
    text = table([run("taproot", 20_000, 40.0), run("nats", 10_000, 20.0)])
    assert "| priority 1Q/1P/1C | nats | 10,000 | 10,000 | 20 | n/a | 2.00 | 2.00 | 2.00 | n/a |" in text


@pytest.mark.integration
def test_a_short_run_acks_and_delivers_everything_and_plots(cluster, tmp_path):
    from taproot_ops.bench.cpu import tree_cpu_seconds
    from taproot_ops.bench.phases import node_urls
    from taproot_ops.bench.phases import scrape as scrape_phases
    from taproot_ops.bench.runner import run

    # Four queues, two per client session: two producer and two consumer sessions.
    scenario = Scenario("test", "priority", queues=4, queues_per_client=2, rate=400, duration_s=2, size=256)
    processes = {name: p.popen.pid for name, p in cluster.processes.items()}
    nodes = node_urls(cluster)
    result = run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False,
                 cpu_probe=lambda: tree_cpu_seconds(processes), phase_probe=lambda: scrape_phases(nodes))
    assert result["failed"] == {} and result["posted"] == result["acked"] > 500
    assert set(result["cpu_s"]) == set(processes) and result["cpu_us_per_msg"] > 0
    # The servers' CPU while the clients closed their queues, after the run's window.
    assert set(result["cpu_closes_s"]) == set(processes) and all(s >= 0 for s in result["cpu_closes_s"].values())
    # Where PUT->ACK went at the node: the three phases, each a mean over this
    # run's messages; the node's part is at most what the producers saw.
    phases = result["put_ack_phases_ms"]
    assert set(phases) == {"to_node", "group", "commit"} and phases["commit"] > 0
    assert set(result["put_ack_phases_slow"]) == set(phases)
    assert all(0 <= share <= 1 for share in result["put_ack_phases_slow"].values())
    # The node's streams carried at least a frame a gRPC message each way.
    assert set(result["node_frames_a_message"]) == {"in", "out"}
    assert all(ratio >= 1 for ratio in result["node_frames_a_message"].values())
    # Its group commits, PUTs and CONFIRMs, each of a message at least.
    commits = result["node_group_commits"]
    assert set(commits) == {"puts", "confirms"}
    assert all(c["count"] > 0 and c["messages"] >= 1 for c in commits.values())
    assert commits["puts"]["count"] * commits["puts"]["messages"] == pytest.approx(result["acked"], rel=0.1)
    assert 0 < sum(phases.values()) <= result["ack_ms"]["max"] and result["ack_mean_ms"] > 0
    assert result["received"] == result["expected_received"] == result["acked"]
    assert 0 < result["ack_ms"]["p50"] <= result["ack_ms"]["max"]
    assert result["push_ms"]["p99"] >= result["ack_ms"]["p50"]  # a PUSH follows its ACK
    png = tmp_path / "run.png"
    plot(result, str(png), "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_an_abandoned_run_stops_its_client_processes_at_once(cluster):
    """A run given up midway (here its CPU probe raises as Ctrl-C would, as
    the producers are about to start) terminates its clients instead of
    waiting for them to finish a 60 s run."""
    import multiprocessing as mp
    import time

    from taproot_ops.bench.runner import run

    def interrupted() -> dict[str, float]:
        raise KeyboardInterrupt
    scenario = Scenario("test", "priority", queues=1, rate=200, duration_s=60, size=256)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False,
            cpu_probe=interrupted)
    assert time.monotonic() - began < 30   # 60 s and more if it waited for its clients
    assert mp.active_children() == []


@pytest.mark.unit
def test_sigterm_stops_a_bench_as_ctrl_c_does():
    """`taproot bench` turns SIGTERM into KeyboardInterrupt while it runs,
    so its `with` blocks stop the embedded cluster (exit 130, as for
    Ctrl-C); a second SIGTERM during that stop does not cut it short; the
    previous handler is put back after. In a process of its own: without
    the handler, the signal ends that process, not pytest."""
    import subprocess
    import sys

    script = """
import os, signal, sys, time
import taproot_ops.bench as bench_package
from taproot_ops import cli

def fake_main(_args):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)   # the handler raises here first
    finally:
        os.kill(os.getpid(), signal.SIGTERM)   # a second one while stopping: ignored
        time.sleep(0.1)
        print("unwound")
    return 0

bench_package.main = fake_main
before = signal.getsignal(signal.SIGTERM)
code = cli.main(["bench", "--scenario", "priority-1q"])
print("exit", code, "restored", signal.getsignal(signal.SIGTERM) is before)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["unwound", "exit", "130", "restored", "True"]
    assert "Traceback" not in run.stderr


@pytest.mark.integration
def test_a_bulk_producer_and_batch_consumers_ack_and_deliver_everything(cluster):
    from taproot_ops.bench.runner import run
    from taproot_ops.bench.scenarios import TAPROOT_ONLY

    scenario = TAPROOT_ONLY["priority-1q-batch"].with_(rate=4_000, duration_s=2, size=256, batch=200)
    assert "bulk producers, batch consumers" in scenario.label
    result = run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False)
    assert result["failed"] == {} and result["posted"] == result["acked"] >= 4_000
    assert result["posted"] % 200 == 0   # whole frames
    assert result["received"] == result["expected_received"] == result["acked"]


@pytest.mark.integration
def test_a_bulk_producer_to_a_broadcast_queue_reaches_all_five_batch_consumers(cluster):
    """`broadcast-5c-bulk`: each bulk frame goes to the five consumers (never
    committed); every consumer receives every ACKed row."""
    from taproot_ops.bench.runner import run
    from taproot_ops.bench.scenarios import TAPROOT_ONLY

    scenario = TAPROOT_ONLY["broadcast-5c-bulk"].with_(rate=4_000, duration_s=2, size=256, batch=200)
    assert "bulk producers, batch consumers" in scenario.label
    result = run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False)
    assert result["failed"] == {} and result["posted"] == result["acked"] >= 4_000
    assert result["received"] == result["expected_received"] == 5 * result["acked"]
    assert result["client_gc"] == "tuned" and result["malloc"] == "tuned"


@pytest.mark.integration
@pytest.mark.spark
def test_fanout_with_app_subscriptions_gives_each_app_exactly_its_messages_and_the_authority_agrees(cluster):
    """`fanout-5c-subs` on the shared cluster: each app gets what its rule
    matches, nothing else, once; then the pipeline's rows come, and the
    authority lag and the (zero) disagreements are read from the tables."""
    import time

    from taproot_ops.bench.authority import authority_lag
    from taproot_ops.bench.cpu import tree_rss_mb
    from taproot_ops.bench.runner import run
    from taproot_ops.bench.scenarios import TAPROOT_ONLY
    from taproot_ops.bench.taproot_driver import domain_file, domain_name

    scenario = TAPROOT_ONLY["fanout-5c-subs"].with_(rate=300, duration_s=2, size=128)
    (cluster.config_path.parent / "domains" / f"{domain_name(scenario)}.toml").write_text(domain_file(scenario))
    time.sleep(2.5)  # the node re-reads domains/ within a second
    processes = {name: p.popen.pid for name, p in cluster.processes.items()}
    result = run("taproot", cluster.proxy_address, scenario, workers=1, drain_idle_s=60, progress=False,
                 memory_probe=lambda: tree_rss_mb(processes))
    assert result["failed"] == {} and result["acked"] > 400
    apps = result["apps"]
    assert set(apps) == {f"app{i}" for i in range(5)}
    assert all(e["received"] == e["expected"] and e["wrong"] == 0 and e["duplicates"] == 0 for e in apps.values())
    assert apps["app0"]["expected"] == result["acked"] > apps["app1"]["expected"] > 0   # app1: n % 2 = 0
    assert all(samples and samples[-1][1] > 10 for samples in result["rss_mb"].values())
    authority = authority_lag(cluster.data_dir, cluster.config.partitions, domain_name(scenario),
                              result["start_s"], result["acked"], timeout_s=180, progress=False)
    assert authority["rows"] == result["acked"] and authority["disagreements"] == 0
    assert 0 < authority["lag_ms"]["p50"] <= authority["lag_ms"]["p99"]


@pytest.mark.unit
def test_the_pipeline_bench_writes_a_put_log_as_the_primary_does(tmp_path):
    from deltalake import DeltaTable

    from storage import tables
    from taproot_ops.bench.pipeline import pipeline_cost, write_put_log

    path = str(tmp_path / "puts")
    assert write_put_log(path, 2_500, 1_000, 64) == 3
    table = DeltaTable(path)
    assert table.version() == 3  # the creation, then one commit per 1,000 rows
    rows = table.to_pyarrow_table()
    assert rows.schema.names == tables.PUTS_SCHEMA.names
    assert sorted(rows["seq"].to_pylist()) == list(range(2_500))
    assert len(set(rows["guid"].to_pylist())) == 2_500
    assert {len(p) for p in rows["payload"].to_pylist()} == {64}
    with pytest.raises(ValueError, match="at least one commit"):
        pipeline_cost(10, 1_000, 64)
    from taproot_ops.bench.pipeline import history_cost
    with pytest.raises(ValueError, match="--history needs N >= --per-batch"):
        history_cost(50_000, 10_000, 100_000, 16)
    with pytest.raises(ValueError, match="--history needs N >= --per-batch"):
        history_cost(200_000, 10_000, 5_000, 16)
    with pytest.raises(ValueError, match="must be at most 100"):
        history_cost(1_000_001, 1_000, 10_000, 16)


@pytest.mark.integration
def test_the_node_cost_bench_pushes_and_confirms_every_row_of_frames_spanning_queues(capsys):
    from taproot_ops.bench.node_cost import main, measure

    cost = measure(queues=7, rows=20, rounds=3, size=16)
    # Every round's PUSHes came back and were confirmed: a row per queue and
    # frame, so the CONFIRM frame names a range (or two) of each of the 7.
    assert (cost.queues, cost.rows, cost.rounds) == (7, 20, 3)
    assert 7 <= cost.ranges <= 20
    assert cost.cpu_us > 0 and cost.put_us > 0 and cost.confirm_us > 0 and cost.round_ms > cost.commit_ms > 0
    # Where the node's threads spent their CPU: each phase's parts inside it,
    # none more than its phase, and the methods as they were afterwards.
    phases = cost.phases_us
    assert {"PUT commit", "PUT commit > Delta append", "PUT commit > express decisions", "CONFIRM dispatch",
            "CONFIRM commit", "CONFIRM commit > Delta append"} <= set(phases)
    for path, us in phases.items():
        if " > " in path:
            assert 0 <= us <= phases[path.rsplit(" > ", 1)[0]] + 1e-9
    from primary.partition import Partition
    assert not hasattr(Partition._commit_puts, "__wrapped__") and not hasattr(Partition.confirm, "__wrapped__")
    assert "\n    PUT commit " in cost.line() and "\n      Delta append " in cost.line()
    # Frames a round: each one ACKed and every row of them pushed and
    # confirmed, or `measure` waits and raises.
    grouped = measure(queues=3, rows=10, rounds=2, size=16, frames=4)
    assert (grouped.rows, grouped.frames) == (10, 4) and 3 <= grouped.ranges <= 40
    assert main(["--queues", "1", "3", "--rows", "6", "--rounds", "2", "--size", "8", "--frames", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 queues cost" in out and "times 1's CPU a message" in out
    assert "6 rows a frame x 2 frames" in out and "ms a round" in out and "ms a PUT commit" in out
    for bad in (["--rows", "0"], ["--frames", "0"]):
        with pytest.raises(SystemExit):
            main(bad)


def test_the_relay_cost_bench_relays_every_frame_and_leaves_nothing_held(capsys):
    from taproot_ops.bench.relay_cost import KINDS, main, measure

    # `measure` raises unless every PUT was sent up, ACKed, and every PUSH confirmed.
    for queues in (1, 7):
        cost = measure(queues=queues, rows=20, rounds=3, size=16)
        assert (cost.queues, cost.rows, cost.rounds) == (queues, 20, 3)
        assert set(cost.us) == set(KINDS) and all(us >= 0 for us in cost.us.values())
        assert cost.total_us == sum(cost.us.values())
    assert main(["--queues", "1", "3", "--rows", "6", "--rounds", "2", "--size", "8"]) == 0
    out = capsys.readouterr().out
    assert "3 queues cost" in out and "times 1's a message" in out
    for bad in (["--rows", "0"], ["--frames", "2"]):   # relay_cost's rounds are one frame of each kind
        with pytest.raises(SystemExit):
            main(bad)


@pytest.mark.unit
def test_the_load_generators_cpu_is_summed_by_role_and_left_out_when_a_worker_was_missed(capsys):
    from taproot_ops.bench import print_result
    from taproot_ops.bench.runner import client_cpu

    before = {"consumer 11": 1.0, "consumer 12": 2.0, "producer 13": 0.5}
    after = {"consumer 11": 4.0, "consumer 12": 3.5, "producer 13": 10.5}
    assert client_cpu(before, after) == {"producers": 10.0, "consumers": 4.5}
    assert client_cpu(before, {"consumer 11": 4.0, "producer 13": 10.5}) is None   # one exited before
    assert client_cpu({}, {}) is None                                              # no /proc
    ms = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0}
    print_result({"system": "taproot", "label": "x", "failed": {}, "produce_msg_s": 1.0, "consume_msg_s": 1.0,
                  "acked": 500_000, "posted": 500_000, "received": 500_000, "expected_received": 500_000,
                  "ack_ms": ms, "push_ms": ms, "client_cpu_s": {"producers": 10.0, "consumers": 4.5}})
    line = next(x for x in capsys.readouterr().out.splitlines() if "load generator CPU" in x)
    assert "producers 10.0 s, consumers 4.5 s: 29 us per message" in line


@pytest.mark.unit
def test_consume_costs_in_one_thread_run_the_sdks_own_paths():
    """`consume_cost`'s two in-thread figures call the SDK's code (they would
    fail, not drift, if it changed under them)."""
    from taproot_ops.bench.consume_cost import confirm_us, rows_to_messages_us

    assert 0 < rows_to_messages_us(rows=20, repeats=2) < 10_000
    assert 0 < confirm_us(messages=20, repeats=2) < 10_000


@pytest.mark.unit
def test_post_costs_seal_runs_the_sdks_own_path():
    """`post_cost.seal_us` seals real batches with the SDK's core (it would
    fail, not drift, if the core changed under it)."""
    from taproot_ops.bench.post_cost import seal_us

    assert 0 < seal_us(64, repeats=2) < 100_000


@pytest.mark.unit
def test_set_changes_one_setting_of_the_shipped_configuration_in_its_own_table(tmp_path):
    """`taproot bench --set SECTION.KEY=VALUE`: an A/B of a setting without a
    worktree. The line changes in its table only (a key of the same name in
    another table stays), and the cluster's configuration loads with it."""
    import conf
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.scenarios import SCENARIOS

    path = write_bench_config(tmp_path / "conf", [SCENARIOS["priority-1q"]], settings=[
        "primary.compact_every_commits=0", 'primary.durability="os"', "ha.stop_timeout_ms = 2500"])
    loaded = conf.load(path, data_dir=str(tmp_path / "data"))
    shipped = conf.load(conf.DEFAULT_CLUSTER_FILE, data_dir=str(tmp_path / "data"))
    assert (loaded.primary.compact_every_commits, loaded.primary.durability, loaded.ha.stop_timeout_ms) == \
        (0, "os", 2500)
    assert shipped.primary.compact_every_commits != 0 and shipped.ha.stop_timeout_ms != 2500
    assert loaded.pipeline == shipped.pipeline and loaded.primary.compact_target_file_bytes == \
        shipped.primary.compact_target_file_bytes


@pytest.mark.unit
@pytest.mark.parametrize("setting, says", [
    ("primary.compact_every_commits", "expected SECTION.KEY=VALUE"),
    ("compact_every_commits=0", "expected SECTION.KEY=VALUE"),
    ("primary.compact_every_commits=1\nnodes = 3", "expected SECTION.KEY=VALUE"),
    ("primary.durability=os", "is not a TOML value"),
    ("nosuch.key=1", r"has no \[nosuch\] table"),
    ("primary.no_such_key=1", r"\[primary\] of the shipped cluster.toml sets no no_such_key"),
    ("primary.compact_every_commits=-5", "must be between 0 and"),
    ('primary.durability="sometimes"', "must be one of fsync, os"),
    ("domain.no_such_key=1", "unknown field"),                  # the scenarios' domains (`--set domain.KEY=VALUE`)
    ("domain.dedup_history_window_ms=5", "must be between"),
    ("domain.dedup_history_window_ms", "expected SECTION.KEY=VALUE"),
])
def test_a_setting_that_is_not_one_or_does_not_load_is_a_clear_error(tmp_path, setting, says):
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.scenarios import SCENARIOS

    with pytest.raises(SystemExit, match=says):
        write_bench_config(tmp_path / "conf", [SCENARIOS["priority-1q"]], settings=[setting])


@pytest.mark.unit
def test_a_wrong_setting_stops_the_bench_before_it_makes_anything(tmp_path, monkeypatch):
    from taproot_ops import bench, cli

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)   # TMPDIR read again
    args = cli.build_parser().parse_args(["bench", "--scenario", "priority-1q", "--set", "ha.stop_timeout_ms=-1"])
    with pytest.raises(SystemExit, match="ha.stop_timeout_ms: must be between"):
        bench._run_taproot(scenarios_from(args), args, None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
def test_set_with_the_domain_section_changes_every_scenario_domain_and_not_the_cluster(tmp_path):
    """`--set domain.KEY=VALUE`: a domain setting (a shorter dedup history
    window, to see memory level off within a run) in each scenario's domain
    file, a fanout domain's tables left as they were; a key the domain file
    already sets is replaced, not repeated."""
    import conf
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.scenarios import SCENARIOS, TAPROOT_ONLY

    scenarios = [SCENARIOS["priority-1q"], TAPROOT_ONLY["fanout-5c-subs"]]
    path = write_bench_config(tmp_path / "conf", scenarios, settings=[
        "domain.dedup_history_window_ms=60000", "domain.max_delivery_attempts = 5", "ha.stop_timeout_ms=2500"])
    loaded = conf.load(path, data_dir=str(tmp_path / "data"))
    shipped = conf.load(conf.DEFAULT_CLUSTER_FILE, data_dir=str(tmp_path / "data"))
    assert loaded.ha.stop_timeout_ms == 2500
    assert sorted(d.mode for d in loaded.domains.values()) == ["fanout", "priority"]
    for domain in loaded.domains.values():
        assert (domain.dedup_history_window_ms, domain.max_delivery_attempts) == (60000, 5)
    fanout = next(d for d in loaded.domains.values() if d.mode == "fanout")
    assert len(fanout.subscriptions) == 3 and len(fanout.app_ids) == 5
    assert loaded.history_window_ms == 60000 != shipped.history_window_ms

    path = write_bench_config(tmp_path / "again", [SCENARIOS["priority-1q"]], settings=['domain.mode="broadcast"'])
    (domain_file,) = (path.parent / "domains").iterdir()
    assert domain_file.read_text().count("mode =") == 1
    assert [d.mode for d in conf.load(path, data_dir=str(tmp_path / "data")).domains.values()] == ["broadcast"]


@pytest.mark.unit
def test_memory_per_minute_is_each_minute_median_so_a_peak_is_not_growth():
    """The sustained run asks for every role's memory flat: a minute's
    median, not its peak, and nothing from before the start."""
    flat_with_peaks = [(-1.0, 999.0)] + [(float(t), 3000.0 if t % 20 == 7 else 400.0 + t % 3) for t in range(180)]
    growing = [(float(t), 100.0 + t) for t in range(150)]
    minutes = rss_by_minute({"node1": flat_with_peaks, "pipeline": growing})
    assert minutes["node1"] == [401.0, 401.0, 401.0]
    assert minutes["pipeline"] == [129.5, 189.5, 234.5]
    assert rss_by_minute({"proxy1": []}) == {"proxy1": []}


def _fake_run(system, scenario, produce, ack_p99, cpu=None):
    return {"system": system, "scenario": scenario, "label": f"{scenario} label", "posted": 10, "acked": 10,
            "failed": {}, "received": 10, "expected_received": 10, "produce_msg_s": produce,
            "consume_msg_s": produce, "ack_ms": {"p50": 1.0, "p99": ack_p99}, "push_ms": {"p50": None},
            "cpu_us_per_msg": cpu}


@pytest.mark.unit
def test_the_spread_of_repeated_runs_is_each_scenarios_median_and_range_in_run_order():
    from taproot_ops.bench.report import fmt_spread, spread

    runs = [_fake_run("taproot", "a", 100.0, 30.0, 20.0) | {"authority": {"lag_ms": {"p99": 7000.0}}},
            _fake_run("taproot", "b", 7.0, 9.0) | {"authority": {"lag_ms": {"p99": None}}},
            _fake_run("taproot", "a", 60.0, 90.0, 25.0), _fake_run("nats", "a", 5.0, 1.0),
            _fake_run("taproot", "a", 65.0, 40.0, 30.0)]
    a, b, nats = spread(runs)
    assert (a["system"], a["scenario"], a["runs"], b["runs"], nats["system"]) == ("taproot", "a", 3, 1, "nats")
    produce = a["figures"]["produce msg/s"]
    assert produce == {"values": [100.0, 60.0, 65.0], "median": 65.0, "min": 60.0, "max": 100.0}
    assert a["figures"]["PUT->ACK p99 ms"]["median"] == 40.0
    assert a["figures"]["server CPU us/msg"]["values"] == [20.0, 25.0, 30.0]
    # A figure a run does not have (no PUSH percentiles, no CPU probe) is left out, not zero.
    assert "PUT->PUSH p99 ms" not in a["figures"] and "server CPU us/msg" not in b["figures"]
    # The authority's lag where a run measured it (not in broadcast, nor without the pipeline).
    assert a["figures"]["authority lag p99 ms"]["values"] == [7000.0] and "authority lag p99 ms" not in b["figures"]
    text = fmt_spread(a)
    assert "a label: 3 runs" in text and "65.0 (60.0-100.0): 100.0, 60.0, 65.0" in text


@pytest.mark.unit
def test_repeat_runs_the_scenarios_in_turn_and_writes_their_spread(tmp_path, monkeypatch, capsys):
    import json

    from taproot_ops import bench, cli
    from taproot_ops.bench import runner

    order, figures = [], iter([100.0, 50.0, 70.0, 40.0])

    def run(system, address, scenario, **kw):
        order.append(scenario.name)
        return _fake_run(system, scenario.name, next(figures), 10.0)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(bench, "plot", lambda result, path, title: open(path, "w").close())
    monkeypatch.setattr(bench, "_run_taproot",
                        lambda scenarios, args, out_dir: bench.run_system("taproot", "x", scenarios, args, out_dir))
    args = cli.build_parser().parse_args(["bench", "--scenario", "priority-1q", "broadcast-5c", "--repeat", "2",
                                          "--out", str(tmp_path)])
    assert bench.main(args) == 0
    assert order == ["priority-1q", "broadcast-5c", "priority-1q", "broadcast-5c"]
    out = capsys.readouterr().out
    assert "run 2 of 2" in out and "priority-1q label: 2 runs" in out
    assert {p.name for p in tmp_path.glob("*.png")} == {f"taproot-{s}-{n}.png" for s in ("priority-1q", "broadcast-5c")
                                                        for n in (1, 2)}
    report = json.loads((tmp_path / "results.json").read_text())
    assert len(report["runs"]) == 4
    assert [(e["scenario"], e["figures"]["produce msg/s"]["values"]) for e in report["spread"]] == [
        ("priority-1q", [100.0, 70.0]), ("broadcast-5c", [50.0, 40.0])]


@pytest.mark.unit
@pytest.mark.parametrize("extra,says", [(["--repeat", "0"], "--repeat 0: give 1 or more"),
                                        (["--repeat", "2", "--replay", "10"], "--replay runs a measurement of its own"),
                                        (["--repeat", "3", "--system", "kafka"], "--system kafka runs a measurement")])
def test_repeat_is_checked_before_anything_starts(extra, says, capsys):
    from taproot_ops import bench, cli

    assert bench.main(cli.build_parser().parse_args(["bench", *extra])) == 2
    assert says in capsys.readouterr().err


@pytest.mark.unit
def test_each_run_reports_the_machines_speed_and_repeat_puts_it_in_the_spread(tmp_path, monkeypatch, capsys):
    import json
    import time

    from taproot_ops import bench, cli
    from taproot_ops.bench import machine, runner

    # Each run's samples: the first run's all fast, the second's half slow.
    runs = iter([[1.5, 1.5, 1.6, 1.5], [1.5, 3.0, 1.5, 3.0]])
    current: list[float] = []

    def run(system, address, scenario, **kw):
        deadline = time.monotonic() + 5
        while len(sampled) < len(current) and time.monotonic() < deadline:
            time.sleep(0.01)
        return _fake_run(system, scenario.name, 1.0, 10.0)

    sampled: list[float] = []

    def work():
        value = current[len(sampled)] if len(sampled) < len(current) else current[0]   # then fast again
        sampled.append(value)
        return value

    def sampler(*a, **kw):
        current[:] = next(runs)
        sampled.clear()
        return machine_sampler(every_s=0.001, work=work)

    machine_sampler = machine.Sampler
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(bench.machine, "Sampler", sampler)
    monkeypatch.setattr(bench, "plot", lambda result, path, title: open(path, "w").close())
    monkeypatch.setattr(bench, "_run_taproot",
                        lambda scenarios, args, out_dir: bench.run_system("taproot", "x", scenarios, args, out_dir))
    args = cli.build_parser().parse_args(["bench", "--scenario", "priority-1q", "--repeat", "2",
                                          "--out", str(tmp_path)])
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "results.json").read_text())
    assert [r["machine"]["fastest_ms"] for r in report["runs"]] == [1.5, 1.5]
    first, second = (r["machine"] for r in report["runs"])
    # The sampler may take a fast sample or two more before the run's end is noticed.
    assert first["slow_share"] == 0.0 and second["slow_share"] == 2 / second["samples"] and second["samples"] >= 4
    assert f"machine speed: 0% of {first['samples']} samples in the slow state" in out
    assert f"machine speed: {second['slow_share'] * 100:.0f}% of {second['samples']} samples" in out
    first, second = first["slow_share"], second["slow_share"]
    values = report["spread"][0]["figures"]["machine slow %"]["values"]
    assert values == [first * 100, second * 100]
