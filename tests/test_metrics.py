"""Prometheus metrics: the pieces (histograms weighted by a frame's messages,
frame counts, bounded queue labels, the HTTP server, the config) and, on the
shared embedded cluster, `/metrics` of the node, the proxy and the pipeline
scraped after known traffic."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

import conf
from protocol import ResultCode, pb
from protocol.metrics import OTHER_QUEUES, FrameCounts, HttpServer, QueueLabels, WeightedHistogram, registry_for
from tests.conftest import collect, serving_node, wait_until

# -- the pieces ----------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_weighted_histogram_counts_each_observation_with_its_messages():
    h = WeightedHistogram((0.01, 0.1, 1.0))
    h.observe(0.005, 700)                    # a frame of 700 messages, 5 ms
    h.observe(0.05)
    h.observe_many([(0.5, 2), (3.0, 1), (0.01, 10)])   # 0.01 is in the le=0.01 bucket
    h.observe(1.0, 0)                        # nothing
    family = HistogramMetricFamily("x", "x")
    h.add_to(family)
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("x_bucket", "0.01")] == 710
    assert samples[("x_bucket", "0.1")] == 711
    assert samples[("x_bucket", "1.0")] == 713
    assert samples[("x_bucket", "+Inf")] == 714 == samples[("x_count", None)] == h.count
    assert samples[("x_sum", None)] == pytest.approx(0.005 * 700 + 0.05 + 1.0 + 3.0 + 0.1)


@pytest.mark.unit
@settings(deadline=None)
@given(st.lists(st.floats(0, 5, allow_nan=False), max_size=40))
def test_a_histogram_observes_an_array_of_values_as_it_observes_them_one_by_one(values):
    """`observe_values` (numpy, a spanning frame's rows) buckets as `observe`
    does: a value on a bound is in that bound's bucket."""
    bounds = (0.01, 0.1, 1.0, 2.5)
    one, many = WeightedHistogram(bounds), WeightedHistogram(bounds)
    for v in values + [0.1, 1.0]:
        one.observe(v)
    many.observe_values(np.array(values + [0.1, 1.0]))
    many.observe_values(np.array([]))
    assert many._counts == one._counts and many.sum == pytest.approx(one.sum)


@pytest.mark.unit
def test_put_ack_is_split_into_phases_that_add_up_to_it():
    from primary.metrics import NodeMetrics

    m = NodeMetrics()
    m.observe_put_ack(put_us=1_000_000, arrived_us=1_012_000, taken_us=1_030_000, acked_us=1_037_000, count=5)
    phases = {p: (h.count, h.sum) for p, h in m.put_ack_phases.items()}
    assert phases["to_node"] == (5, pytest.approx(5 * 0.012))
    assert phases["group"] == (5, pytest.approx(5 * 0.018))
    assert phases["commit"] == (5, pytest.approx(5 * 0.007))
    assert (m.put_ack.count, m.put_ack.sum) == (5, pytest.approx(5 * 0.037))

    # A producer's clock ahead of the node's: nothing is negative and the
    # phases still add up to PUT->ACK (here all of it commit time).
    m = NodeMetrics()
    m.observe_put_ack(put_us=2_000_000, arrived_us=1_990_000, taken_us=1_995_000, acked_us=2_004_000, count=1)
    assert [m.put_ack_phases[p].sum for p in ("to_node", "group", "commit")] == [0, 0, pytest.approx(0.004)]
    assert m.put_ack.sum == pytest.approx(0.004)
    # No arrival time: the wait before the commit is all `group`.
    m = NodeMetrics()
    m.observe_put_ack(put_us=0, arrived_us=0, taken_us=20_000, acked_us=25_000, count=2)
    assert [m.put_ack_phases[p].sum for p in ("to_node", "group", "commit")] == [
        0, pytest.approx(0.040), pytest.approx(0.010)]


def test_frame_counts_read_acks_by_code_and_messages_from_the_headers():
    counts = FrameCounts()
    counts.observe(pb.Frame(ack=pb.AckBatch(messages=[
        pb.AckMessage(code=ResultCode.SUCCESS), pb.AckMessage(code=ResultCode.SUCCESS),
        pb.AckMessage(code=ResultCode.LIMIT_BYTES)])))
    counts.observe(pb.Frame(ack_columns=pb.AckColumns(
        guids=b"g" * 16 * 5, code=ResultCode.SUCCESS, refused_rows=[1, 3],
        refused_codes=[ResultCode.INVALID_ARGUMENT, ResultCode.LIMIT_MESSAGES])))
    counts.observe(pb.Frame(ack_columns=pb.AckColumns(guids=b"g" * 16 * 4, code=ResultCode.STORAGE_FAILURE)))
    counts.observe(pb.Frame(push=pb.PushBatch(messages=[pb.PushMessage(), pb.PushMessage(queue_ids=[1, 2, 3])])))
    counts.observe(pb.Frame(push_columns=pb.PushColumns(count=100)))
    counts.observe(pb.Frame(push_columns=pb.PushColumns(count=10, queue_ids=[4, 5])))   # broadcast to two
    counts.observe(pb.Frame(heartbeat=pb.Heartbeat()))
    counts.observe(pb.Frame())                                                          # no body: ignored
    counts.received(pb.Frame(put=pb.PutBatch(messages=[pb.PutMessage(), pb.PutMessage()])))
    counts.received(pb.Frame(put_columns=pb.PutColumns(guids=b"g" * 16 * 7)))
    counts.received(pb.Frame(confirm=pb.ConfirmBatch(messages=[pb.ConfirmMessage()])))
    counts.received(pb.Frame(confirm_columns=pb.ConfirmColumns(starts=[1, 10], counts=[5, 6])))
    counts.received(pb.Frame(heartbeat=pb.Heartbeat()))
    assert counts.acks == {"SUCCESS": 5, "LIMIT_BYTES": 1, "INVALID_ARGUMENT": 1, "LIMIT_MESSAGES": 1,
                           "STORAGE_FAILURE": 4}
    assert counts.pushes == 1 + 3 + 100 + 20
    assert (counts.puts, counts.confirms) == (9, 12)
    assert counts.frames == {"ack": 1, "ack_columns": 2, "push": 1, "push_columns": 2, "heartbeat": 1}


@pytest.mark.unit
def test_queue_labels_stay_bounded():
    labels = QueueLabels(max_series=2)
    assert [labels.label("d", q) for q in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER_QUEUES, "a",
                                                                             OTHER_QUEUES, "b"]
    assert labels.label("e", "a") == OTHER_QUEUES          # (domain, queue): another domain's "a" is new
    assert QueueLabels(0).label("d", "a") == OTHER_QUEUES


@pytest.mark.unit
def test_the_pipeline_counts_its_dedup_history_and_the_time_spent_expiring_it(caplog):
    """From each micro-batch's progress: the GUIDs its dedup state holds
    (added less expired, summed over the batches: Spark does not count them,
    numRowsTotal is 0) and the task time spent scanning them for expired ones."""
    from pipelines.runner import DedupState, PipelineStats, log_progress

    def progress(batch: int, added: int, removed: int, removals_ms: int) -> dict:
        return {"batchId": batch, "numInputRows": 1000, "durationMs": {"triggerExecution": 900, "addBatch": 800},
                "stateOperators": [{"numRowsTotal": 0, "numRowsUpdated": added // 2, "numRowsRemoved": removed,
                                    "allRemovalsTimeMs": removals_ms},
                                   {"numRowsTotal": 0, "numRowsUpdated": added - added // 2, "numRowsRemoved": 0,
                                    "allRemovalsTimeMs": 1}]}

    class Query:
        name = "taproot-dedup-000"
        recentProgress = [progress(0, 1000, 0, 40), progress(1, 1201, 200, 250)]

    assert DedupState.of({"stateOperators": []}) is None
    assert DedupState.of(progress(1, 1201, 200, 250)) == DedupState(added=1201, removed=200, eviction_ms=251)
    # After a restart the query expires GUIDs it did not count: never below none.
    assert DedupState(added=10, removed=500, eviction_ms=0).held_after(100) == 0
    stats, logged = PipelineStats(), {}
    with caplog.at_level("INFO", logger="pipelines.runner"):
        log_progress(Query(), logged, stats)   # type: ignore[arg-type]
        log_progress(Query(), logged, stats)   # type: ignore[arg-type]  # nothing new: counted once
    assert "dedup history 1000 GUIDs, +1000 -0, expiring them 41 ms" in caplog.text
    assert "dedup history 2001 GUIDs, +1201 -200, expiring them 251 ms" in caplog.text
    samples = {(s.name, tuple(s.labels.values())): s.value for family in stats.collect() for s in family.samples}
    assert samples[("taproot_pipeline_dedup_history_guids", ("taproot-dedup-000",))] == 2001
    assert samples[("taproot_pipeline_dedup_eviction_seconds_total", ("taproot-dedup-000",))] == pytest.approx(0.292)
    assert samples[("taproot_pipeline_batches_total", ("taproot-dedup-000",))] == 2


@pytest.mark.unit
def test_an_idle_report_is_no_batch_and_the_batch_after_it_is_counted(caplog):
    """While idle, Spark reports a trigger that found no data every 10 s,
    under the id the next batch will take (seen on Spark 4.2: `3 0 rows`
    twice, then `3 7 rows`). Such a report is no batch, and the batch that
    follows it under the same id is still logged and counted."""
    from pipelines.runner import PipelineStats, log_progress

    def report(batch: int, at: str, rows: int, ran: bool = True) -> dict:
        durations = {"triggerExecution": 500, "latestOffset": 3, **({"addBatch": 400} if ran else {})}
        return {"batchId": batch, "timestamp": f"2026-11-29T19:00:{at}Z", "numInputRows": rows,
                "durationMs": durations}

    class Query:
        name = "taproot-dedup-000"
        recentProgress = [report(2, "01.000", 50)]

    stats, logged = PipelineStats(), {}
    with caplog.at_level("INFO", logger="pipelines.runner"):
        log_progress(Query(), logged, stats)   # type: ignore[arg-type]
        Query.recentProgress += [report(3, "12.000", 0, ran=False), report(3, "23.000", 0, ran=False)]
        log_progress(Query(), logged, stats)   # type: ignore[arg-type]
        Query.recentProgress += [report(3, "25.000", 7)]
        log_progress(Query(), logged, stats)   # type: ignore[arg-type]
    assert "batch 3: 7 rows" in caplog.text and "batch 3: 0 rows" not in caplog.text
    samples = {(s.name, tuple(s.labels.values())): s.value for family in stats.collect() for s in family.samples}
    assert samples[("taproot_pipeline_batches_total", ("taproot-dedup-000",))] == 2
    assert samples[("taproot_pipeline_input_rows_total", ("taproot-dedup-000",))] == 57


@pytest.mark.integration   # a server on a loopback port
def test_the_http_server_serves_metrics_and_routes_and_says_what_it_cannot():
    from prometheus_client.core import GaugeMetricFamily

    def collect_gauge():
        yield GaugeMetricFamily("taproot_test_gauge", "a test gauge", value=42)

    def broken():
        raise RuntimeError("the status could not be read")

    server = HttpServer("test", "127.0.0.1", 0, registry_for(collect_gauge),
                        {"/status.json": lambda: ("application/json", b'{"ok": true}'), "/broken": broken}).start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "taproot_test_gauge 42.0" in text
        assert "process_cpu_seconds_total" in text                 # the process's own
        assert urllib.request.urlopen(f"{base}/status.json", timeout=5).read() == b'{"ok": true}'
        for path, code, says in (("/nope", 404, "try /metrics"), ("/broken", 500, "the status could not be read")):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}{path}", timeout=5)
            assert err.value.code == code and says in err.value.read().decode()
        # The server survived both.
        assert "taproot_test_gauge" in urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()

        with pytest.raises(SystemExit, match=f"node n1: cannot serve metrics on 127.0.0.1:{server.port}: .*http_port"):
            HttpServer("node n1", "127.0.0.1", server.port, CollectorRegistry())
    finally:
        server.stop()


@pytest.mark.unit
def test_the_http_ports_of_the_config():
    config = conf.parse_cluster({"nodes": [{"name": "a", "port": 40000}, {"name": "b", "port": 0},
                                           {"name": "c", "http_port": -1}, {"name": "d", "http_port": 0}],
                                 "proxies": [{"name": "p", "port": 40001, "http_port": 40099}],
                                 "metrics": {"max_queue_series": 5}}, {})
    ports = [conf.http_port_of(n.http_port, n.port) for n in config.nodes]
    assert ports == [40010, 0, None, 0]                 # the gRPC port + 10; any free; none; any free
    assert conf.http_port_of(config.proxies[0].http_port, config.proxies[0].port) == 40099
    assert config.metrics.max_queue_series == 5 and config.pipeline.http_port == 30126
    for raw, says in (({"nodes": [{"name": "a", "http_port": -2}]}, "nodes[0].http_port: must be between -1 and 65535"),
                      ({"pipeline": {"http_port": 70000}}, "pipeline.http_port: must be between -1 and 65535"),
                      ({"metrics": {"max_series": 5}}, "metrics.max_series: unknown field"),
                      ({"metrics": {"max_queue_series": "many"}}, "metrics.max_queue_series: expected int")):
        with pytest.raises(conf.ConfigError, match=says.replace("[", r"\[").replace("]", r"\]")):
            conf.parse_cluster(raw, {})


@pytest.mark.unit
def test_a_bad_http_port_on_the_command_line_is_a_usage_error(capsys):
    from taproot_ops.cli import main
    for bad in ("70000", "http"):
        with pytest.raises(SystemExit) as exit_:
            main(["node", "--http-port", bad])
        assert exit_.value.code == 2
        assert "--http-port" in capsys.readouterr().err


# -- a live cluster --------------------------------------------------------------------------------

def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.integration
def test_metrics_after_known_traffic_count_it_exactly(cluster):
    from taproot import Session

    queue_name = f"metrics-{uuid.uuid4().hex[:8]}"
    uri = f"taproot://demo/{queue_name}"
    node, proxy = cluster.metrics_url("node1"), cluster.metrics_url("proxy1")
    q = dict(domain="demo", queue=queue_name)
    node_before, proxy_before = scrape(node), scrape(proxy)
    with Session([cluster.proxy_address]) as session:
        reader = session.open_queue(uri, read=True)
        writer = session.open_queue(uri, write=True)
        singles = [writer.post(f"m{i}".encode()) for i in range(37)]
        bulk = writer.post_columns(pa.table({"payload": pa.array([b"x" * 10] * 50, pa.binary())}))
        for f in singles:
            f.result(30)
        assert len(bulk.result(30)) == 50
        got = collect(reader, 87, timeout_s=60)
        assert len(got) == 87

        during = scrape(node)
        assert value(during, "taproot_queue_consumers", **q) == 1
        assert value(during, "taproot_queue_producers", **q) == 1
        # Confirms travel and commit on their own schedule (100 ms linger).
        wait_until(lambda: value(scrape(node), "taproot_queue_confirms_total", **q, app="") == 87, 30,
                   what="87 confirms counted")
    after = scrape(node)
    assert value(after, "taproot_queue_puts_total", **q) == 87
    assert value(after, "taproot_queue_pushes_total", **q, app="") == 87
    assert value(after, "taproot_queue_redeliveries_total", **q, app="") == 0
    assert value(after, "taproot_queue_depth_messages", **q, app="") == 0
    assert value(after, "taproot_queue_unconfirmed_messages", **q, app="") == 0
    assert value(after, "taproot_queue_consumers", **q) == 0

    def delta(samples, before, name, **labels):
        return value(samples, name, **labels) - value(before, name, **labels)

    # Node-wide counts move by exactly this traffic (the tests run one at a time).
    assert delta(after, node_before, "taproot_acks_sent_total", code="SUCCESS") == 87
    assert delta(after, node_before, "taproot_puts_received_total") == 87
    assert delta(after, node_before, "taproot_confirms_received_total") == 87
    assert delta(after, node_before, "taproot_pushes_sent_total") == 87
    assert delta(after, node_before, "taproot_put_ack_seconds_count") == 87
    assert delta(after, node_before, "taproot_put_push_seconds_count") == 87
    assert value(after, "taproot_put_ack_seconds_bucket", le="+Inf") == value(after, "taproot_put_ack_seconds_count")
    phases = ("to_node", "group", "commit")
    for phase in phases:
        assert delta(after, node_before, "taproot_put_ack_phase_seconds_count", phase=phase) == 87
    # The phases add up to PUT->ACK, and the producer's put went through all three.
    assert sum(delta(after, node_before, "taproot_put_ack_phase_seconds_sum", phase=p) for p in phases) == \
        pytest.approx(delta(after, node_before, "taproot_put_ack_seconds_sum"), rel=1e-6)
    assert delta(after, node_before, "taproot_put_ack_phase_seconds_sum", phase="commit") > 0
    assert delta(after, node_before, "taproot_group_commit_messages_sum", partition="0", log="puts") == 87
    assert value(after, "taproot_group_commit_seconds_count", partition="0", log="puts") >= 1
    assert value(after, "taproot_partition_epoch", partition="0") >= 1
    assert value(after, "taproot_partitions_taken_total") >= 1
    assert value(after, "taproot_retransmission_buffer_messages") == 0
    # What the express lane holds: the 87 GUIDs in its dedup window (and whatever
    # else this partition took in the window); its decisions until the pipeline judged them.
    assert value(after, "taproot_express_history_guids", partition="0") >= 87
    assert value(after, "taproot_express_history_bytes", partition="0") >= 87 * 34
    assert ("taproot_express_decisions_held", (("partition", "0"),)) in after
    # The pipeline's micro-batches (Spark's commits to the delivery log) are
    # read from their commit files, not through delta-rs's change feed.
    direct = "taproot_delivery_log_versions_read_total"
    wait_until(lambda: value(scrape(node), direct, partition="0", how="commit_file")
               > value(node_before, direct, partition="0", how="commit_file"), 90,
               what="the pipeline's delivery rows read from their commit files")
    assert any(name == "taproot_arrow_allocated_bytes" for name, _ in after)
    assert value(after, "process_resident_memory_bytes") > 0

    proxy_after = scrape(proxy)
    assert delta(proxy_after, proxy_before, "taproot_acks_sent_total", code="SUCCESS") == 87
    assert delta(proxy_after, proxy_before, "taproot_puts_received_total") == 87
    assert delta(proxy_after, proxy_before, "taproot_pushes_sent_total") == 87
    assert delta(proxy_after, proxy_before, "taproot_confirms_received_total") == 87
    assert value(proxy_after, "taproot_retransmission_buffer_messages") == 0
    assert value(proxy_after, "taproot_upstream_connected") == 1

    # The pipeline judges these rows in its next micro-batches.
    pipeline = cluster.metrics_url("pipeline")
    wait_until(lambda: value(scrape(node), "taproot_authority_lag_seconds", partition="0") == 0, 60,
               what="the pipeline caught up")
    query = "taproot-dedup-000"
    # The pipeline reads its queries' progress twice a second.
    samples = wait_until(lambda: (lambda s: s if value(s, "taproot_pipeline_input_rows_total", query=query) >= 87
                                  else None)(scrape(pipeline)), 10, what="the pipeline's batches counted")
    assert value(samples, "taproot_pipeline_query_active", query=query) == 1
    assert value(samples, "taproot_pipeline_batches_total", query=query) >= 1
    assert value(samples, "taproot_pipeline_batch_seconds_count", query=query) == \
        value(samples, "taproot_pipeline_batches_total", query=query)
    # The dedup history holds at least these 87 GUIDs (posted well inside its window).
    assert value(samples, "taproot_pipeline_dedup_history_guids", query=query) >= 87
    assert ("taproot_pipeline_dedup_eviction_seconds_total", (("query", query),)) in samples
    # Its own lag estimate, which its CPU share follows: a caught-up pipeline is not behind by its bound.
    assert ("taproot_pipeline_authority_lag_seconds", (("query", query),)) in samples
    assert 0 <= value(samples, "taproot_pipeline_authority_lag_seconds", query=query) < 60


@pytest.mark.integration
def test_a_refused_put_is_counted_by_its_code(cluster):
    from taproot import AckError, Session

    queue_name = f"metrics-{uuid.uuid4().hex[:8]}"
    node = cluster.metrics_url("node1")
    before = scrape(node)
    with Session([cluster.proxy_address]) as session:
        writer = session.open_queue(f"taproot://demo/{queue_name}", write=True)
        too_big = b"x" * (writer.max_payload_bytes + 1)
        writer._record.max_payload_bytes = 0   # past the SDK's own check: the node refuses it
        with pytest.raises(AckError):
            writer.post(too_big).result(30)
    after = scrape(node)
    assert value(after, "taproot_acks_sent_total", code="INVALID_ARGUMENT") - \
        value(before, "taproot_acks_sent_total", code="INVALID_ARGUMENT") == 1
    assert value(after, "taproot_queue_puts_total", domain="demo", queue=queue_name) == 0


@pytest.mark.integration   # a node in this process: leases and tables on a temp dir, no sockets
def test_a_nodes_queue_series_stay_bounded_and_the_rest_are_summed(tmp_path):
    from conf import ClusterConfig, HaConfig, MetricsConfig, NodeConfig, parse_domain
    from primary import metrics as node_metrics
    from tests.test_spanning_frames import next_of

    config = ClusterConfig(data_dir=str(tmp_path), partitions=1, nodes=(NodeConfig("node1", port=1),),
                           ha=HaConfig(lease_duration_ms=4000, lease_renew_interval_ms=500),
                           metrics=MetricsConfig(max_queue_series=2), domains={"d": parse_domain("d", {})})
    with serving_node(config) as (node, link):
        names = ["q1", "q2", "q3", "q4"]
        for qid, name in enumerate(names, start=1):
            node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(request_id=qid, queue_id=qid,
                                                                 uri=f"taproot://d/{name}", write=True)))
            assert next_of(link, "open_queue_response").open_queue_response.status.code == ResultCode.SUCCESS
            count = qid   # q1 gets 1 message, q4 gets 4
            node.on_frame(link, pb.Frame(put=pb.PutBatch(messages=[
                pb.PutMessage(queue_id=qid, guid=bytes([qid, i]) * 8, payload=b"x") for i in range(count)])))
            acked = 0
            while acked < count:
                acked += len(next_of(link, "ack").ack.messages)
        registry = registry_for(lambda: node_metrics.collect(node))
        puts = {s.labels["queue"]: s.value for family in registry.collect() for s in family.samples
                if s.name == "taproot_queue_puts_total"}
        # The first two queues reported keep their names; the others are one series.
        assert puts == {"q1": 1, "q2": 2, OTHER_QUEUES: 3 + 4}
