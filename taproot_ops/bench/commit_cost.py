"""What one durable PUT-log commit costs on this machine, with and without
delta-rs writing checkpoints in the commit (its post-commit hook): the
primary's `storage.deltars.Appender` on a temp directory, one commit after
another, nothing else running.

    .venv/bin/python -m taproot_ops.bench.commit_cost [--commits 300] [--rows 1000] [--size 1024]

It prints the commit latency percentiles and the last commits' latencies, to
show how the cost moves as the log grows. `--no-checkpoints` commits with
delta-rs's checkpoint hook off (what moving checkpoints off the commit path
would do to the writer's handle).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
from deltalake import PostCommitHookProperties

from storage import deltars

SCHEMA = pa.schema([("guid", pa.binary()), ("seq", pa.int64()), ("payload", pa.binary())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--no-checkpoints", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        appender = deltars.Appender(os.path.join(d, "puts"), SCHEMA)
        hooks = PostCommitHookProperties(create_checkpoint=not args.no_checkpoints, cleanup_expired_logs=False)
        payload = os.urandom(args.size)
        times = []
        for n in range(args.commits):
            batch = pa.table({"guid": [os.urandom(16) for _ in range(args.rows)],
                              "seq": pa.array(range(n * args.rows, (n + 1) * args.rows), pa.int64()),
                              "payload": [payload] * args.rows}, schema=SCHEMA)
            started = time.perf_counter()
            add = deltars.write_data_file(appender.root or d, batch)
            deltars.commit_durably(appender.table, appender.root or d, [add], SCHEMA, None, hooks)
            times.append((time.perf_counter() - started) * 1000)
    t = np.array(times)
    p50, p90, p99, top = np.percentile(t, [50, 90, 99, 100])
    print(f"{args.commits} durable commits of {args.rows} x {args.size} B, checkpoints "
          f"{'off' if args.no_checkpoints else 'in the commit'}: p50 {p50:.1f} p90 {p90:.1f} p99 {p99:.1f} "
          f"max {top:.1f} ms")
    print("first 10:", " ".join(f"{x:.0f}" for x in times[:10]), "ms")
    print("last 10: ", " ".join(f"{x:.0f}" for x in times[-10:]), "ms")


if __name__ == "__main__":
    main()
