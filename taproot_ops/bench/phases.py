"""Where a run's PUT->ACK went at the nodes: the means of
`taproot_put_ack_phase_seconds` (`primary.metrics.NodeMetrics.observe_put_ack`)
over the run, from the nodes' own metrics, scraped before and after it, and
the share of messages each phase kept over 50 ms; and how many frames each
gRPC message of their Session streams carried (`taproot_stream_frames_total`
over `taproot_stream_messages_total`, `protocol.bundles`); the nodes'
fsyncs over the run (`taproot_fsync_seconds`): how many, their mean, and the
share that waited on the disk over `FSYNC_SLOW_S`; and their group commits
by log (`taproot_group_commit_messages`): how many, and their mean size. A
node's CPU follows its frames and commits more than its messages
(`docs/benchmarks.md`, 2026-12-07, twenty-sixth session), so a run shows
them."""

from __future__ import annotations

import urllib.request
from typing import Any, Iterator, Sequence

from prometheus_client.parser import text_string_to_metric_families

FAMILY = "taproot_put_ack_phase_seconds"
STREAM_FAMILIES = {"taproot_stream_frames": 0, "taproot_stream_messages": 1}
STREAM = "stream "   # a Totals key: "stream in" / "stream out" -> (frames, gRPC messages)
# A Totals key: "slow <phase>" -> (messages whose phase took at most
# `SLOW_S`, messages): the share of a run's messages each phase made late.
SLOW = "slow "
SLOW_S = 0.05        # the paced PUT->ACK p99 asked for (a bucket of `protocol.metrics.LATENCY_BUCKETS`)
FSYNC_FAMILY = "taproot_fsync_seconds"
FSYNC = "fsync"       # a Totals key: (seconds summed over fsyncs, fsyncs)
FSYNC_FAST = "fsync within"   # a Totals key: (fsyncs of at most FSYNC_SLOW_S, fsyncs)
FSYNC_SLOW_S = 0.01  # a bucket of `protocol.metrics.LATENCY_BUCKETS`
COMMITS_FAMILY = "taproot_group_commit_messages"
COMMITS = "commits "  # a Totals key: "commits <log>" -> (messages summed over commits, commits)
Totals = dict[str, tuple[float, float]]   # phase -> (seconds summed over messages, messages)


def node_urls(cluster: Any) -> list[str]:
    """The metrics URLs of an embedded cluster's nodes (those serving one)."""
    return [cluster.metrics_url(name) for name, p in cluster.processes.items()
            if p.role == "node" and name in cluster.http_ports]


def scrape(urls: Sequence[str], timeout_s: float = 5.0) -> Totals:
    """Each phase's sum and count, added over the nodes at `urls`. A node that
    does not answer counts nothing (the bench still prints what it has)."""
    totals: dict[str, list[float]] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                text = response.read().decode()
        except OSError:
            continue
        totals_of(text, totals)
    return {phase: (t[0], t[1]) for phase, t in totals.items()}


def totals_of(text: str, into: dict[str, list[float]]) -> None:
    for family in text_string_to_metric_families(text):
        if family.name in STREAM_FAMILIES:
            for sample in family.samples:
                direction = sample.labels.get("direction")
                if direction is not None and sample.name.endswith("_total"):
                    into.setdefault(STREAM + direction, [0.0, 0.0])[STREAM_FAMILIES[family.name]] += sample.value
            continue
        if family.name == FSYNC_FAMILY:
            for sample in family.samples:
                _add_histogram_sample(into, FSYNC_FAMILY, sample, FSYNC, FSYNC_FAST, FSYNC_SLOW_S)
            continue
        if family.name == COMMITS_FAMILY:
            for sample in family.samples:
                log = sample.labels.get("log")
                if log is not None:
                    _add_histogram_sample(into, COMMITS_FAMILY, sample, COMMITS + log)
            continue
        if family.name != FAMILY:
            continue
        for sample in family.samples:
            phase = sample.labels.get("phase")
            if phase is not None:
                _add_histogram_sample(into, FAMILY, sample, phase, SLOW + phase, SLOW_S)


def _add_histogram_sample(into: dict[str, list[float]], family: str, sample: Any, key: str,
                          within_key: str | None = None, within_s: float | None = None) -> None:
    """One sample of the histogram `family` into the totals: its sum and
    count under `key`, and with a `within_key`, (observations of at most
    `within_s`, count) under it."""
    if sample.name == family + "_sum":
        into.setdefault(key, [0.0, 0.0])[0] += sample.value
    elif sample.name == family + "_count":
        into.setdefault(key, [0.0, 0.0])[1] += sample.value
        if within_key is not None:
            into.setdefault(within_key, [0.0, 0.0])[1] += sample.value
    elif (within_key is not None and sample.name == family + "_bucket"
          and float(sample.labels.get("le", "nan")) == within_s):
        into.setdefault(within_key, [0.0, 0.0])[0] += sample.value


def means_ms(before: Totals, after: Totals) -> dict[str, float]:
    """Each phase's mean over the messages ACKed between the two scrapes, in
    ms; empty when none was."""
    return {phase: mean * 1000 for phase, mean in _over_run(before, after, "")}


def frames_a_message(before: Totals, after: Totals) -> dict[str, float]:
    """The frames each gRPC message carried over the run at the nodes, by
    direction ("in", "out"); empty for a direction with no message."""
    return dict(_over_run(before, after, STREAM))


def slow_shares(before: Totals, after: Totals) -> dict[str, float]:
    """Per phase, the share of the messages ACKed between the scrapes whose
    phase took longer than `SLOW_S` (where a PUT->ACK tail comes from: one
    phase, or all of them at once, as a machine short of CPU makes it)."""
    return {phase: 1.0 - within for phase, within in _over_run(before, after, SLOW)}


def fsyncs(before: Totals, after: Totals) -> dict[str, float]:
    """The nodes' fsyncs between the scrapes: how many, their mean in ms, and
    the share that took longer than `FSYNC_SLOW_S`; empty without one."""
    seconds, n = _grown(before, after, FSYNC)
    if n <= 0:
        return {}
    fast = _grown(before, after, FSYNC_FAST)[0]
    return {"count": n, "mean_ms": seconds / n * 1000, "slow_share": 1.0 - fast / n}


def group_commits(before: Totals, after: Totals) -> dict[str, dict[str, float]]:
    """Per log ("puts", "confirms"), the nodes' group commits between the
    scrapes: how many, and their mean messages; a log without one is left out."""
    return {log: {"count": n, "messages": messages / n} for log, messages, n in _grown_by_kind(before, after, COMMITS)}


def _grown(before: Totals, after: Totals, key: str) -> tuple[float, float]:
    """How much `key`'s sum and count grew between the scrapes."""
    total0, count0 = before.get(key, (0.0, 0.0))
    total, count = after.get(key, (0.0, 0.0))
    return total - total0, count - count0


KINDS = (STREAM, SLOW, FSYNC, COMMITS)


def _over_run(before: Totals, after: Totals, kind: str) -> Iterator[tuple[str, float]]:
    """Per key of a kind ("": the phases' means; `STREAM`, `SLOW`), without
    its prefix, what its sum grew by over its count's growth between the
    scrapes; a key whose count did not grow is left out."""
    for name, total, n in _grown_by_kind(before, after, kind):
        yield name, total / n


def _grown_by_kind(before: Totals, after: Totals, kind: str) -> Iterator[tuple[str, float, float]]:
    """Per key of a kind (`KINDS`, or "" for the phases), without its
    prefix, how much its sum and count grew between the scrapes; a key
    whose count did not grow is left out."""
    for key in after:
        if next((k for k in KINDS if key.startswith(k)), "") == kind:
            total, n = _grown(before, after, key)
            if n > 0:
                yield key[len(kind):], total, n
