"""One table of every system's runs, with Taproot/peer ratios."""

from __future__ import annotations

from typing import Any


def _num(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:,.0f}{unit}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "n/a"
    return f"{ours / theirs:.2f}"


def table(runs: list[dict[str, Any]]) -> str:
    """Markdown: per scenario, each system's produce/consume msg/s and ACK/PUSH
    p99, then Taproot's ratio to each peer (throughput: higher is better for
    Taproot; latency: lower is better for Taproot)."""
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
                ratios = [_ratio(ours["produce_msg_s"], r["produce_msg_s"]),
                          _ratio(ours["consume_msg_s"], r["consume_msg_s"]),
                          _ratio(ours["ack_ms"]["p99"], r["ack_ms"]["p99"]),
                          _ratio(ours["push_ms"]["p99"], r["push_ms"]["p99"])]
            lines.append(f"| {label} | {system} | {_num(r['produce_msg_s'])} | {_num(r['consume_msg_s'])} | "
                         f"{_num(r['ack_ms']['p99'])} | {_num(r['push_ms']['p99'])} | " + " | ".join(ratios) + " |")
    return "\n".join(lines)
