"""What the primary's GUID history costs the commit thread, per commit: the
express lane's dedup decision for every PUT it commits.

    .venv/bin/python -m taproot_ops.bench.guid_history [--rate 50000] [--commit-rows 1000] [--seconds 330]

Feeds one `GuidHistory` (a 300 s window, as `conf/cluster.toml`'s) commits
of `--commit-rows` random GUIDs, as many a second as `--rate` makes, on a
simulated clock, and prints the time `commit` took: over the first span of
the window (young GUIDs only, what a 20 s `taproot bench` run sees), over
the last minute (the window full: every generation searched), the
slowest commits and the process's resident memory (the commit thread waits for the GIL while a generation is
built beside it). GUIDs go in as a list of 16-byte values, as the recovery
path gives them.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Callable

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=50_000, help="GUIDs a second")
    parser.add_argument("--commit-rows", type=int, default=1000, help="GUIDs a commit")
    parser.add_argument("--seconds", type=float, default=330.0, help="simulated seconds (the window is 300)")
    parser.add_argument("--window-s", type=float, default=300.0)
    args = parser.parse_args(argv)

    from primary.express import GENERATIONS, GuidHistory

    def on_a_thread(task: Callable[[], None]) -> Callable[[], None]:
        thread = threading.Thread(target=task, daemon=True)
        thread.start()
        return thread.join

    # As a primary makes it (`primary.partition`, not imported here: its
    # libraries would count in the memory): its own hash, its generations
    # built on a thread.
    history = GuidHistory(int(args.window_s * 1e6), seed=os.urandom(16), spawn=on_a_thread)
    step_us = int(args.commit_rows / args.rate * 1e6)
    commits = int(args.seconds * 1e6 / step_us)
    span = int(args.window_s / GENERATIONS * 1e6 / step_us)
    minute = int(60e6 / step_us)
    print(f"{commits:,} commits of {args.commit_rows:,} GUIDs, one every {step_us / 1000:.1f} ms "
          f"({args.rate:,} GUIDs/s) over {args.seconds:.0f} simulated s ...", flush=True)
    took = np.empty(commits)
    now_us = 0
    for i in range(commits):
        blob = os.urandom(16 * args.commit_rows)
        guids = [blob[j:j + 16] for j in range(0, len(blob), 16)]
        now_us += step_us
        started = time.perf_counter()
        history.commit(guids, now_us)
        took[i] = time.perf_counter() - started
    took *= 1e6

    def line(name: str, part: np.ndarray) -> None:
        print(f"  {name}: p50 {np.percentile(part, 50):,.0f} us, p99 {np.percentile(part, 99):,.0f} us, "
              f"max {part.max():,.0f} us ({np.percentile(part, 50) / args.commit_rows * 1000:,.0f} ns a GUID)")

    line("first span (young GUIDs only)", took[:span])
    if commits > minute:
        line("last minute", took[-minute:])
    import resource

    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    print(f"  commits over 10 ms: {int((took > 10_000).sum())}; GUIDs held at the end: {len(history):,}; "
          f"this process's memory {rss / 2**20:,.0f} MiB at the end, "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB at most")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
