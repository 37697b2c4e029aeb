"""The command line of the cost benches that compare queue counts
(`node_cost`, `relay_cost`): the same options, a line per queue count, and
each count's cost against the first's."""

from __future__ import annotations

import argparse
from typing import Callable, Protocol, Sequence


class Cost(Protocol):
    queues: int

    def line(self) -> str: ...


def main(name: str, doc: str, measure: Callable[..., Cost], per_message: Callable[[Cost], float],
         argv: Sequence[str] | None, *, queues: Sequence[int], rows: int, rows_help: str, rounds: int,
         rounds_help: str, unit: str, announce: bool = False, frames_help: str | None = None) -> int:
    """Parse `argv`, `measure(queues, rows, rounds, size)` for each queue
    count (with `frames=` too when `frames_help` gives the bench a
    `--frames`), print each result's line and each count's `per_message`
    cost against the first's ("N queues cost X times M's `unit`")."""
    parser = argparse.ArgumentParser(prog=f"python -m taproot_ops.bench.{name}", description=doc.split("\n\n")[0])
    parser.add_argument("--queues", type=int, nargs="+", default=list(queues), help="queue counts to compare")
    parser.add_argument("--rows", type=int, default=rows, help=rows_help)
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    if frames_help is not None:
        parser.add_argument("--frames", type=int, default=1, help=frames_help)
    args = parser.parse_args(argv)
    more = {} if frames_help is None else {"frames": args.frames}
    if min(args.queues) < 1 or args.rows < 1 or args.rounds < 1 or args.size < 0 or more.get("frames", 1) < 1:
        parser.error("--queues, --rows, --rounds and --frames must be at least 1, --size at least 0")
    results = []
    for count in args.queues:
        if announce:
            frames = f"{more['frames']} frames of " if more.get("frames", 1) > 1 else ""
            print(f"measuring {count:,} queues ({args.rounds} rounds of {frames}{args.rows} rows) ...", flush=True)
        try:
            results.append(measure(count, args.rows, args.rounds, args.size, **more))
        except RuntimeError as exc:
            print(f"{name}: {exc}")
            return 1
        print("  " + results[-1].line(), flush=True)
    base = per_message(results[0])
    for r in results[1:]:
        print(f"{r.queues:,} queues cost {per_message(r) / base:.2f} times {results[0].queues:,}'s {unit}")
    return 0
