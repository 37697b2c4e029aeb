"""Benchmark results: sustained rates, latency percentiles, time series, plots."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

PERCENTILES = (50, 90, 99, 100)


@dataclass
class Samples:
    """Event times (epoch seconds) and latencies (ms), as compact arrays so
    worker processes can ship millions of them."""
    times: array[float] = field(default_factory=lambda: array("d"))
    latency_ms: array[float] = field(default_factory=lambda: array("d"))
    apps: dict[int, Any] = field(default_factory=dict)   # app subscriptions: app -> {received, wrong}

    def add(self, at_s: float, latency_ms: float) -> None:
        self.times.append(at_s)
        self.latency_ms.append(latency_ms)

    def add_many(self, at_s: float, latency_ms: float, count: int) -> None:
        """`count` events with one time and latency (the rows of one frame;
        one PUT's ACK is a single append, not two new arrays)."""
        if count == 1:
            self.add(at_s, latency_ms)
            return
        self.times.extend(array("d", [at_s]) * count)
        self.latency_ms.extend(array("d", [latency_ms]) * count)

    def add_array(self, at_s: float, latency_ms: "np.ndarray") -> None:
        """Events with one time and a latency each (the rows of a batch)."""
        self.times.extend(array("d", [at_s]) * len(latency_ms))
        self.latency_ms.frombytes(np.ascontiguousarray(latency_ms, dtype=np.float64).tobytes())

    def extend(self, other: "Samples") -> None:
        self.times.extend(other.times)
        self.latency_ms.extend(other.latency_ms)
        self.apps.update(other.apps)

    def __len__(self) -> int:
        return len(self.times)


def percentiles(latency_ms: Sequence[float]) -> dict[str, float | None]:
    if len(latency_ms) == 0:
        return {("max" if q == 100 else f"p{q}"): None for q in PERCENTILES}
    values = np.asarray(latency_ms)
    return {("max" if q == 100 else f"p{q}"): float(np.percentile(values, q)) for q in PERCENTILES}


def sustained_rate(times: Sequence[float]) -> float:
    """Events per second between the first and the last event."""
    if len(times) < 2:
        return 0.0
    span = max(times) - min(times)
    return len(times) / span if span > 0 else 0.0


def time_series(samples: Samples, start_s: float, bucket_s: float = 1.0) -> dict[str, list[Any]]:
    """Per-bucket count (as msg/s) and latency p50/p99/max, from `start_s`."""
    out: dict[str, list[Any]] = {"t": [], "rate": [], "p50": [], "p99": [], "max": []}
    if not len(samples):
        return out
    times = np.asarray(samples.times) - start_s
    latency = np.asarray(samples.latency_ms)
    buckets = np.floor(times / bucket_s).astype(np.int64)
    for b in range(int(buckets.min()), int(buckets.max()) + 1):
        mask = buckets == b
        n = int(mask.sum())
        out["t"].append(b * bucket_s)
        out["rate"].append(n / bucket_s)
        out["p50"].append(float(np.percentile(latency[mask], 50)) if n else math.nan)
        out["p99"].append(float(np.percentile(latency[mask], 99)) if n else math.nan)
        out["max"].append(float(latency[mask].max()) if n else math.nan)
    return out


def summarize(acks: Samples, pushes: Samples, posted: int, failed: dict[str, int], start_s: float) -> dict[str, Any]:
    return {
        "posted": posted,
        "acked": len(acks),
        "failed": failed,
        "received": len(pushes),
        "produce_msg_s": sustained_rate(acks.times),
        "consume_msg_s": sustained_rate(pushes.times),
        "ack_ms": percentiles(acks.latency_ms),
        # Beside the nodes' mean phases (`put_ack_phases_ms`), which time a
        # frame's messages from its first one's put.
        "ack_mean_ms": float(np.mean(acks.latency_ms)) if len(acks.latency_ms) else None,
        "push_ms": percentiles(pushes.latency_ms),
        "series": {"ack": time_series(acks, start_s), "push": time_series(pushes, start_s)},
        # Per minute: does a long run hold its latency from the first minute to the last?
        "minutes": {"ack": time_series(acks, start_s, 60.0), "push": time_series(pushes, start_s, 60.0)},
    }


def rss_by_minute(rss: dict[str, list[tuple[float, float]]]) -> dict[str, list[float]]:
    """Each role's resident MiB per minute of the run (samples `(s from the
    start, MiB)`, one a second): the median of the minute's samples, so a
    transient peak (a commit's buffers, a garbage collection) does not pass
    for growth. Samples before the start (the idle cluster) are left out."""
    minutes: dict[str, list[float]] = {}
    for role, samples in rss.items():
        by: dict[int, list[float]] = {}
        for t, mb in samples:
            if t >= 0:
                by.setdefault(int(t // 60), []).append(mb)
        minutes[role] = [round(float(np.median(by[m])), 1) for m in sorted(by)]
    return minutes


# The figures `spread` summarises: (name, how to read it from a run's result).
SPREAD_FIGURES: tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...] = (
    ("produce msg/s", lambda r: r.get("produce_msg_s")),
    ("consume msg/s", lambda r: r.get("consume_msg_s")),
    ("PUT->ACK p50 ms", lambda r: (r.get("ack_ms") or {}).get("p50")),
    ("PUT->ACK p99 ms", lambda r: (r.get("ack_ms") or {}).get("p99")),
    ("PUT->PUSH p99 ms", lambda r: (r.get("push_ms") or {}).get("p99")),
    ("server CPU us/msg", lambda r: r.get("cpu_us_per_msg")),
    ("authority lag p99 ms", lambda r: ((r.get("authority") or {}).get("lag_ms") or {}).get("p99")),
    # The share of the run the shared host's cores ran slow (`machine.py`): the run's window.
    ("machine slow %", lambda r: None if not r.get("machine") else r["machine"]["slow_share"] * 100),
)


def spread(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeated runs of each scenario on each system (`taproot bench
    --repeat`): one entry per scenario and system, in the order of their
    first runs, with every figure of
    `SPREAD_FIGURES` a run has, as its values in run order with their
    median, minimum and maximum. One run is not a result on a shared
    machine; the range says how far apart runs of the same thing land."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["system"], run["scenario"]), []).append(run)
    out = []
    for (system, scenario), group in groups.items():
        figures = {}
        for name, read in SPREAD_FIGURES:
            values = [float(v) for v in map(read, group) if v is not None]
            if values:
                figures[name] = {"values": values, "median": float(np.median(values)),
                                 "min": min(values), "max": max(values)}
        out.append({"system": system, "scenario": scenario, "label": group[0].get("label", scenario),
                    "runs": len(group), "figures": figures})
    return out


def fmt_spread(entry: dict[str, Any]) -> str:
    """One scenario's `spread` entry as lines for the terminal."""
    lines = [f"{entry['system']:>8} {entry['label']}: {entry['runs']} runs, median (min-max), each run in order"]
    for name, f in entry["figures"].items():
        lines.append(f"         {name:<20} {f['median']:>10,.1f} ({f['min']:,.1f}-{f['max']:,.1f}): "
                     + ", ".join(f"{v:,.1f}" for v in f["values"]))
    return "\n".join(lines)


def fmt_ms(values: dict[str, Any]) -> str:
    if values.get("p50") is None:
        return "n/a"
    return " ".join(f"{k}={v:,.1f}" for k, v in values.items()) + " ms"


def plot(result: dict[str, Any], path: str, title: str) -> None:
    """Throughput and latency over time, one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ack, push = result["series"]["ack"], result["series"]["push"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    top.plot(ack["t"], ack["rate"], marker=".", label="produce (ACKed msg/s)")
    top.plot(push["t"], push["rate"], marker=".", label="consume (pushed msg/s)")
    top.set_ylabel("msg/s")
    top.legend(loc="upper right")
    top.grid(alpha=0.3)
    for series, name in ((ack, "PUT->ACK"), (push, "PUT->PUSH")):
        if series["t"]:
            bottom.plot(series["t"], series["p50"], marker=".", label=f"{name} p50")
            bottom.plot(series["t"], series["p99"], marker=".", linestyle="--", label=f"{name} p99")
    bottom.set_yscale("log")
    bottom.set_ylabel("latency, ms (log)")
    bottom.set_xlabel("seconds since the first PUT")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
