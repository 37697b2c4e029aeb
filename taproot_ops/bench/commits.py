"""What one delta-rs commit of the PUT log costs, and how that grows with the
table's history: the primary's own `Appender` (fenced, checkpoints every 10
commits) and `Compactor` (every 50 commits), on a temp dir, no other load.

    .venv/bin/python -m taproot_ops.bench.commits --commits 3000 --rows 300 [--durability os]

Prints, per `--every` commits, the wall and CPU time they took and the files
in `_delta_log`. The node pays this per PUT group commit and per CONFIRM group
commit, whatever the group's size, so on a small machine it sets the floor of
PUT->ACK (and, with the express lane, of PUT->PUSH).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import datetime, timezone

import pyarrow as pa

from primary.compaction import Compactor
from storage import deltars, tables


def _batch(rows: int, first_seq: int, size: int) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.table({
        "domain": ["bench"] * rows, "queue": ["q"] * rows, "guid": [os.urandom(16) for _ in range(rows)],
        "seq": list(range(first_seq, first_seq + rows)), "payload": [b"x" * size] * rows,
        "properties": pa.array([[]] * rows, tables.PROPERTY_MAP),
        "property_types": pa.array([[]] * rows, tables.PROPERTY_MAP),
        "producer_time": pa.array([now] * rows, tables.TIMESTAMP), "put_time": pa.array([now] * rows, tables.TIMESTAMP),
        "epoch": [1] * rows, "compression": pa.nulls(rows, pa.string())}, schema=tables.PUTS_SCHEMA)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=300, help="messages per commit")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--every", type=int, default=500, help="print a line per this many commits")
    parser.add_argument("--compact-every", type=int, default=50, help="0: no compaction")
    parser.add_argument("--durability", choices=["fsync", "os"], default="fsync",
                        help="fsync: each commit on stable storage before it returns (the default); os: not")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="taproot-commits-") as scratch:
        path = tables.PartitionPaths(scratch, 0).puts
        durable = args.durability == "fsync"
        appender = deltars.Appender(path, tables.PUTS_SCHEMA, epoch=1, durable=durable)
        compactor = Compactor(path, args.compact_every, "bench", durable=durable)
        compactor.start()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            for i in range(1, args.commits + 1):
                appender.append(_batch(args.rows, (i - 1) * args.rows, args.size))
                compactor.on_commit()
                if i % args.every == 0:
                    cpu, wall = time.process_time(), time.perf_counter()
                    logs = len(os.listdir(os.path.join(path, "_delta_log")))
                    print(f"commits {i - args.every + 1:,}-{i:,}: {(wall - wall0) * 1000 / args.every:.1f} ms wall, "
                          f"{(cpu - cpu0) * 1000 / args.every:.1f} ms CPU per commit (compaction included); "
                          f"{logs:,} files in _delta_log", flush=True)
                    cpu0, wall0 = cpu, wall
        finally:
            compactor.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
