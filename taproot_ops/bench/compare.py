"""Taproot beside its peers, one table per scenario, with Taproot/peer ratios.

`taproot bench --compare` (`run_comparison`) runs, one after the other on
this machine: Kafka, NATS JetStream and RabbitMQ with their own load tools
(`kafka.py`, `nats_native.py`, `rabbitmq_native.py`), then Taproot's
embedded cluster with the comparison's scenarios (`TAPROOT`: its fastest
client path, a bulk producer and batch consumers, and per-message `post()`
and iteration). Every run names one of `native.SCENARIOS`; `tables` makes
one markdown table of each, its rows the systems and durabilities, and one
of ratios. A peer that cannot be had here (no Maven, no Go, a build or a
run that failed) is a row saying so, not a missing one.

`table` is the older comparison's: the same Taproot scenarios through the
peers' Python clients (`--compare-python`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
from pathlib import Path
from typing import Any, Callable

from taproot_ops.bench.native import FANOUT, ONE_QUEUE, PACED, SCENARIOS, TEN_QUEUES, PeerUnavailable
from taproot_ops.bench.scenarios import SCENARIOS as BLAZINGMQ
from taproot_ops.bench.scenarios import TAPROOT_ONLY, Scenario

TAPROOT_DURABILITY = "fsync every group commit (shipped)"

# The comparison's Taproot runs: (scenario, row label, the bench scenario).
TAPROOT: list[tuple[str, str, Scenario]] = [
    (ONE_QUEUE, "bulk producer, batch consumer", TAPROOT_ONLY["priority-1q-batch"]),
    (ONE_QUEUE, "per-message post() and iteration", BLAZINGMQ["priority-1q"]),
    (TEN_QUEUES, "10 bulk producers, 10 batch consumers", TAPROOT_ONLY["priority-10q-batch"]),
    (TEN_QUEUES, "10 producers, 10 consumers, per message", BLAZINGMQ["priority-10q"]),
    (FANOUT, "5 apps, bulk producer, batch consumers", TAPROOT_ONLY["fanout-5c-batch"]),
    (FANOUT, "5 apps, per message", BLAZINGMQ["fanout-5c"]),
    (PACED, "bulk producer, batch consumer", TAPROOT_ONLY["priority-1q-batch"].with_(name="paced-batch",
                                                                                    rate=10_000)),
    (PACED, "per-message post() and iteration", BLAZINGMQ["priority-1q"].with_(name="paced", rate=10_000)),
]

# The peers: (system, module, its run_all's arguments from --duration).
PEERS: list[tuple[str, str, Callable[[float], dict[str, Any]]]] = [
    ("kafka", "kafka", lambda seconds: {"records": 1_000_000, "fsync_records": 250_000, "paced_s": seconds}),
    ("nats", "nats_native", lambda seconds: {"messages": 1_000_000, "fsync_messages": 100_000, "paced_s": seconds}),
    ("rabbitmq", "rabbitmq_native", lambda seconds: {"seconds": seconds}),
]


def taproot_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench's Taproot results (in `TAPROOT`'s order) as comparison rows."""
    rows = []
    for (scenario, label, _), r in zip(TAPROOT, results):
        rows.append({"system": "taproot", "scenario": scenario, "label": label, "durability": TAPROOT_DURABILITY,
                     "produce_msg_s": r["produce_msg_s"], "consume_msg_s": r["consume_msg_s"],
                     "ack_ms": r["ack_ms"], "push_ms": r["push_ms"],
                     "server_cpu_us_per_msg": r.get("cpu_us_per_msg"),
                     "failed": sum(r["failed"].values()), "lost": max(0, r["expected_received"] - r["received"]),
                     # Where the CPU went (node, proxy, pipeline) and how far behind the authority was.
                     "cpu_s": r.get("cpu_s"), "authority": {k: v for k, v in (r.get("authority") or {}).items()
                                                            if k in ("lag_ms", "rows", "expected", "waited_s",
                                                                     "disagreements", "cpu_s")}})
    return rows


def unavailable(system: str, reason: str, label: str = "not available here") -> dict[str, Any]:
    """A row for a peer that could not be run here (or whose run failed: `label`), and why."""
    return {"system": system, "scenario": None, "label": label, "durability": "", "reason": reason,
            "produce_msg_s": None, "consume_msg_s": None, "ack_ms": None, "push_ms": None,
            "server_cpu_us_per_msg": None}


def run_peer(system: str, module: str, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """One peer's runs; a peer that cannot be had, or a run that fails, is a
    row saying why (after the runs done before it)."""
    peer = importlib.import_module(f"taproot_ops.bench.{module}")
    print(f"\n== {system} ==", flush=True)
    runs: list[dict[str, Any]] = []
    try:
        peer.run_all(**kwargs, runs=runs)
    except PeerUnavailable as exc:
        print(f"{system}: not available here: {exc}", flush=True)
        runs.append(unavailable(system, str(exc)))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"{system}: a run failed after {len(runs)}: {exc}", flush=True)
        runs.append(unavailable(system, str(exc), f"a run failed after {len(runs)} runs"))
    return runs


def run_comparison(args: argparse.Namespace, run_taproot: Callable[[list[Scenario]], list[dict[str, Any]]],
                   out_dir: Path | None) -> int:
    """Every peer, then Taproot; the tables printed, and written with the runs."""
    seconds = args.duration or 20.0
    runs: list[dict[str, Any]] = []
    for system, module, kwargs in PEERS:
        runs += run_peer(system, module, kwargs(seconds))
    print("\n== taproot ==", flush=True)
    results = run_taproot([s.with_(duration_s=seconds) for _, _, s in TAPROOT])
    runs += taproot_rows(results)
    text = tables(runs)
    print("\n" + text, flush=True)
    report = {"seconds": seconds, "runs": runs}
    if out_dir is not None:
        (out_dir / "compare.md").write_text(text + "\n")
    for target in filter(None, [args.json, out_dir and str(out_dir / "results.json")]):
        Path(target).write_text(json.dumps(report, indent=1))
    return 1 if any(r.get("failed") or r.get("lost") for r in runs) else 0


def _num(value: float | None, digits: int | None = None, empty: str = "") -> str:
    """`digits` decimals; by default one below 10, none from 10."""
    if value is None:
        return empty
    if digits is None:
        digits = 1 if abs(value) < 10 else 0
    return f"{value:,.{digits}f}"


def _pair(values: dict[str, Any] | None) -> str:
    if not values or values.get("p50") is None:
        return ""
    return f"{_num(values['p50'])} / {_num(values['p99'])}"


def _ratio(ours: float | None, theirs: float | None, empty: str = "") -> str:
    if not ours or not theirs:
        return empty
    return f"{ours / theirs:.2f}"


def _p(values: dict[str, Any] | None, q: str) -> float | None:
    return None if not values else values.get(q)


def tables(runs: list[dict[str, Any]]) -> str:
    """Markdown: per scenario, a table of every system's rows (produce and
    consume msg/s, PUT->ACK and PUT->PUSH p50 / p99 ms, server CPU µs per
    produced message), then one of Taproot ÷ peer for each Taproot row
    against each peer row (throughput above 1 and latency or CPU below 1
    favour Taproot). Peers that could not be run are a row of every table."""
    out: list[str] = []
    missing = [r for r in runs if r["scenario"] is None]
    for scenario in SCENARIOS:
        rows = [r for r in runs if r["scenario"] == scenario]
        if not rows:
            continue
        out += [f"### {scenario}", "",
                "| system | run | durability | produce msg/s | consume msg/s | PUT->ACK p50 / p99 ms | "
                "PUT->PUSH p50 / p99 ms | server CPU µs/msg |",
                "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            push = _pair(r["push_ms"]) + (f" ({r['push_ms']['note']})" if (r["push_ms"] or {}).get("note") else "")
            out.append(f"| {r['system']} | {r['label']} | {r['durability']} | {_num(r['produce_msg_s'])} | "
                       f"{_num(r['consume_msg_s'])} | {_pair(r['ack_ms'])} | {push} | "
                       f"{_num(r['server_cpu_us_per_msg'], 1)} |")
        for r in missing:
            out.append(f"| {r['system']} | {r['label']}: {r['reason']} | | | | | | |")
        ours = [r for r in rows if r["system"] == "taproot"]
        theirs = [r for r in rows if r["system"] != "taproot" and (r["produce_msg_s"] or r["push_ms"])]
        if ours and theirs:
            out += ["", "Taproot ÷ peer (throughput above 1, latency and CPU below 1: Taproot ahead):", "",
                    "| Taproot run | peer run | produce | consume | ACK p50 | ACK p99 | PUSH p50 | PUSH p99 | "
                    "CPU/msg |", "|---|---|---|---|---|---|---|---|---|"]
            for a in ours:
                for b in theirs:
                    cells = [_ratio(a["produce_msg_s"], b["produce_msg_s"]),
                             _ratio(a["consume_msg_s"], b["consume_msg_s"])]
                    cells += [_ratio(_p(a[k], q), _p(b[k], q)) for k in ("ack_ms", "push_ms") for q in ("p50", "p99")]
                    cells.append(_ratio(a["server_cpu_us_per_msg"], b["server_cpu_us_per_msg"]))
                    out.append(f"| {a['label']} | {b['system']}, {b['label']}, {b['durability']} | "
                               + " | ".join(cells) + " |")
        out.append("")
    if not out:   # no scenario ran at all: still say which peers could not be run, and why
        out = [f"{r['system']}: {r['label']}: {r['reason']}" for r in missing]
    return "\n".join(out).rstrip()


def table(runs: list[dict[str, Any]]) -> str:
    """`--compare-python`'s table: per bench scenario, each system's
    produce/consume msg/s and ACK/PUSH p99, then Taproot's ratio to each
    peer (throughput: higher is better for Taproot; latency: lower is
    better for Taproot)."""
    by_scenario: dict[str, dict[str, dict[str, Any]]] = {}
    for r in runs:
        by_scenario.setdefault(r["label"], {})[r["system"]] = r
    lines = ["| scenario | system | produce msg/s | consume msg/s | PUT->ACK p99 ms | PUT->PUSH p99 ms | "
             "Taproot/peer produce | consume | ACK p99 | PUSH p99 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, systems in by_scenario.items():
        ours = systems.get("taproot")
        for system, r in systems.items():
            ratios = ["", "", "", ""]
            if ours is not None and system != "taproot":
                ratios = [_ratio(ours["produce_msg_s"], r["produce_msg_s"], "n/a"),
                          _ratio(ours["consume_msg_s"], r["consume_msg_s"], "n/a"),
                          _ratio(ours["ack_ms"]["p99"], r["ack_ms"]["p99"], "n/a"),
                          _ratio(ours["push_ms"]["p99"], r["push_ms"]["p99"], "n/a")]
            lines.append(f"| {label} | {system} | {_num(r['produce_msg_s'], 0, 'n/a')} | "
                         f"{_num(r['consume_msg_s'], 0, 'n/a')} | {_num(r['ack_ms']['p99'], 0, 'n/a')} | "
                         f"{_num(r['push_ms']['p99'], 0, 'n/a')} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)
