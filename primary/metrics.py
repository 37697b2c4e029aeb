"""A node's Prometheus metrics (`protocol.metrics`): read from the node's
state when scraped, except the histograms and frame counts, which the data
path feeds a frame (or a commit) at a time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from primary.dispatcher import MessageRun, SharedPush
from protocol.clock import wall_time_us
from protocol.metrics import LATENCY_BUCKETS, FrameCounts, QueueLabels, Summed, WeightedHistogram
from storage import deltars

if TYPE_CHECKING:
    from primary.dispatcher import Pending
    from primary.node import Node
    from primary.partition import Partition

MAX_QUEUE_SERIES = 1000
# Where a committed PUT's PUT->ACK goes, at the node (`NodeMetrics.observe_put_ack`).
PUT_ACK_PHASES = ("to_node", "group", "commit")


class NodeMetrics:
    """What the data path counts for a node's metrics (its partitions share it)."""

    def __init__(self, max_queue_series: int = MAX_QUEUE_SERIES) -> None:
        self.put_ack = WeightedHistogram(LATENCY_BUCKETS)
        self.put_push = WeightedHistogram(LATENCY_BUCKETS)
        self.put_ack_phases = {phase: WeightedHistogram(LATENCY_BUCKETS) for phase in PUT_ACK_PHASES}
        self.frames = FrameCounts()
        self.labels = QueueLabels(max_queue_series)
        self.partitions_taken = 0     # leases won and served (the first and every failover to here)
        self.partitions_lost = 0      # stepped down (a lost lease, a newer primary)

    def observe_put_ack(self, put_us: int, arrived_us: int, taken_us: int, acked_us: int, count: int) -> None:
        """PUT->ACK of `count` committed messages put at `put_us` (the
        producer's clock), and its three phases, which add up to it:
        `to_node`, until the node handed them to the group commit (the
        producer's batching, every hop, the node's reading and admission);
        `group`, until the commit thread took their group (the linger, a
        commit before it); `commit`, until their ACK left (the rows, the
        Parquet file, the log entry, their fsyncs). Without `arrived_us`,
        the first two phases are one, counted as `group`. A frame's
        messages are timed from its first one's put, as PUT->ACK is."""
        total = max(0, acked_us - put_us)
        commit = min(total, max(0, acked_us - taken_us))
        to_node = min(total - commit, max(0, arrived_us - put_us)) if arrived_us else 0
        self.put_ack.observe(total / 1e6, count)
        phases = self.put_ack_phases
        phases["to_node"].observe(to_node / 1e6, count)
        phases["group"].observe((total - commit - to_node) / 1e6, count)
        phases["commit"].observe(commit / 1e6, count)

    def observe_pushes(self, pushes: Sequence[tuple[object, "Pending | SharedPush"]]) -> None:
        """PUT->PUSH of first deliveries, from the producer's put time (its
        clock) to the PUSH handed to the link."""
        now_us = wall_time_us()
        seen: list[tuple[float, int]] = []
        for _, pending in pushes:
            if pending.delivery_count != 1:
                continue
            if isinstance(pending, MessageRun):
                rows, put_us = len(pending), pending.table["put_time_us"][0].as_py()
            elif isinstance(pending, SharedPush):   # (many producers' rows; each its own time)
                put_us = pending.put_times_us()
                put_us = put_us[put_us != 0]
                self.put_push.observe_values(np.maximum(0, now_us - put_us) / 1e6)
                continue
            else:
                rows, put_us = 1, pending.put_time_us
            if put_us:
                seen.append((max(0, now_us - put_us) / 1e6, rows))
        self.put_push.observe_many(seen)


def _queue_families(node: "Node") -> Iterator[Metric]:
    labels = node.metrics.labels
    puts, pushes, redelivered, confirmed = Summed(), Summed(), Summed(), Summed()
    depth, unconfirmed, consumers, producers, dropped = Summed(), Summed(), Summed(), Summed(), Summed()
    for _, partition in sorted(node.partitions.items()):
        with partition.lock:
            for state in list(partition.queues.values()):
                domain = state.uri.domain
                queue = labels.label(domain, state.uri.queue)   # a routed queue's name is queue@cluster
                puts.add((domain, queue), state.accepted)
                consumers.add((domain, queue), state.consumers)
                producers.add((domain, queue), state.producers)
                for app, d in state.dispatchers.items():
                    key = (domain, queue, app)
                    pushes.add(key, d.pushed)
                    redelivered.add(key, d.redelivered)
                    confirmed.add(key, d.confirmed)
                    held = d.unconfirmed_count
                    depth.add(key, d.pending_count + held)
                    unconfirmed.add(key, held)
                    for reason, n in d.dropped.items():
                        dropped.add((*key, reason), n)
    q, qa = ("domain", "queue"), ("domain", "queue", "app")
    yield puts.counter("taproot_queue_puts", "messages stored (or broadcast) per queue", q)
    yield pushes.counter("taproot_queue_pushes", "messages pushed to consumers (redeliveries too)", qa)
    yield redelivered.counter("taproot_queue_redeliveries", "messages pushed again (a consumer went "
                              "without confirming)", qa)
    yield confirmed.counter("taproot_queue_confirms", "messages confirmed", qa)
    yield dropped.counter("taproot_queue_dead_letters", "messages dead-lettered (out of delivery attempts, "
                          "expired), by reason", (*qa, "reason"))
    yield depth.gauge("taproot_queue_depth_messages", "messages not yet confirmed: waiting and pushed", qa)
    yield unconfirmed.gauge("taproot_queue_unconfirmed_messages", "messages pushed, not yet confirmed", qa)
    yield consumers.gauge("taproot_queue_consumers", "consumers attached (reader opens)", q)
    yield producers.gauge("taproot_queue_producers", "producers attached (writer opens)", q)


def _partition_families(node: "Node") -> Iterator[Metric]:
    epoch = GaugeMetricFamily("taproot_partition_epoch", "the primary epoch of each partition this node leads",
                              labels=["partition"])
    lag = GaugeMetricFamily("taproot_authority_lag_seconds", "age of the oldest PUT commit the pipeline has "
                            "not judged yet (0: caught up)", labels=["partition"])
    commits = HistogramMetricFamily("taproot_group_commit_seconds", "one group commit: the Delta append, "
                                    "its fsyncs and the answers", labels=["partition", "log"])
    sizes = HistogramMetricFamily("taproot_group_commit_messages", "messages in one group commit",
                                  labels=["partition", "log"])
    linger = GaugeMetricFamily("taproot_group_commit_linger_seconds", "how long the last group's first "
                               "item could wait for company (longer while the node is busy)",
                               labels=["partition", "log"])
    history = GaugeMetricFamily("taproot_express_history_guids", "GUIDs the express lane holds for its dedup "
                                "window (about the rate times the window)", labels=["partition"])
    history_bytes = GaugeMetricFamily("taproot_express_history_bytes", "memory those GUIDs take (about 34 "
                                      "bytes each, and the young table's for its capacity)", labels=["partition"])
    held = GaugeMetricFamily("taproot_express_decisions_held", "express decisions waiting for the pipeline's "
                             "delivery rows (about the rate times the authority lag)", labels=["partition"])
    versions = CounterMetricFamily("taproot_delivery_log_versions_read", "versions of the delivery log the "
                                   "primary's tail has read: from their commit files (a micro-batch's append), "
                                   "or through delta-rs's change feed (deletes, a new column)",
                                   labels=["partition", "how"])
    now = time.time()
    for p, partition in sorted(node.partitions.items()):
        epoch.add_metric([str(p)], partition.epoch)
        direct, change_feed = partition.delivery_versions_read()
        versions.add_metric([str(p), "commit_file"], direct)
        versions.add_metric([str(p), "change_feed"], change_feed)
        lag.add_metric([str(p)], authority_lag_s(partition, now))
        guids, nbytes, decisions = partition.express_held()
        history.add_metric([str(p)], guids)
        history_bytes.add_metric([str(p)], nbytes)
        held.add_metric([str(p)], decisions)
        for log_name, committer in (("puts", partition.put_committer), ("confirms", partition.confirm_committer)):
            committer.seconds.add_to(commits, (str(p), log_name))
            committer.sizes.add_to(sizes, (str(p), log_name))
            linger.add_metric([str(p), log_name], committer.linger_ms / 1000)
    yield epoch
    yield lag
    yield history
    yield history_bytes
    yield held
    yield commits
    yield sizes
    yield linger
    yield versions
    metrics = node.metrics
    yield CounterMetricFamily("taproot_partitions_taken", "partitions this node became primary of (its first "
                              "leases and every failover to it)", value=metrics.partitions_taken)
    yield CounterMetricFamily("taproot_partitions_lost", "partitions this node stopped leading (lease lost, "
                              "fenced, handed over)", value=metrics.partitions_lost)


def authority_lag_s(partition: "Partition", now: float) -> float:
    oldest = partition.oldest_unjudged_commit()
    return max(0.0, now - oldest) if oldest is not None else 0.0


def collect(node: "Node") -> Iterator[Metric]:
    yield from _queue_families(node)
    yield from _partition_families(node)
    metrics = node.metrics
    ack = HistogramMetricFamily("taproot_put_ack_seconds", "PUT->ACK of committed messages: the producer's put "
                                "time (its clock) to the ACK leaving this node")
    metrics.put_ack.add_to(ack)
    yield ack
    phases = HistogramMetricFamily("taproot_put_ack_phase_seconds", "taproot_put_ack_seconds in three phases "
                                   "that add up to it: to_node (the producer's batching, every hop, this node's "
                                   "reading and admission), group (waiting for the group commit: its linger, the "
                                   "commit before), commit (until the ACK left)", labels=["phase"])
    for phase, histogram in metrics.put_ack_phases.items():
        histogram.add_to(phases, [phase])
    yield phases
    push = HistogramMetricFamily("taproot_put_push_seconds", "PUT->PUSH of first deliveries: the producer's "
                                 "put time (its clock) to the PUSH leaving this node")
    metrics.put_push.add_to(push)
    yield push
    yield from metrics.frames.families()
    buffered = node.forwarding.buffered()
    yield GaugeMetricFamily("taproot_retransmission_buffer_messages", "PUTs relayed to another node's "
                            "partitions, held until their ACK", value=buffered[0])
    yield GaugeMetricFamily("taproot_retransmission_buffer_bytes", "their payload bytes", value=buffered[1])
    fsyncs = HistogramMetricFamily("taproot_fsync_seconds", "every fsync of this node's tables (data files, "
                                   "commits, their directories, checkpoints, compactions): the disk's sync "
                                   "latency, which each durable commit waits for three times over")
    deltars.FSYNC_SECONDS.add_to(fsyncs)
    yield fsyncs
    pool = pa.default_memory_pool()
    arrow = GaugeMetricFamily("taproot_arrow_allocated_bytes", "bytes Arrow's default memory pool has "
                              "allocated and not freed (frames, commits, compaction)", labels=["backend"])
    arrow.add_metric([pool.backend_name], pool.bytes_allocated())
    yield arrow
