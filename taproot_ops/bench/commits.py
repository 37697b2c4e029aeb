"""What one commit of the PUT log costs, and how that grows with the
table's history: the primary's own `Appender` (fenced, checkpoints every 10
commits) and `Compactor` (compaction every 50 commits, log trimming as the
node does it, with no reader holding the log back), on a temp dir, no other
load.

    .venv/bin/python -m taproot_ops.bench.commits --commits 3000 --rows 300 [--durability os]
        [--no-trim] [--no-checkpoints] [--compact-every 0] [--object-store] [--settle] [--delta-rs]
        [--contend N]

`--object-store` puts the table on an S3-compatible server instead (a
SeaweedFS started for the run, `taproot_ops.object_store`): each commit is
then HTTP requests, a conditional write for the commit file among them.

Prints, per `--every` commits, the wall and CPU time they took and the files
in `_delta_log`, then the percentiles of single commits. The node pays this
per PUT group commit and per CONFIRM group commit, whatever the group's
size, so on a small machine it sets the floor of PUT->ACK (and, with the
express lane, of PUT->PUSH). `--no-trim` keeps every log entry (Delta's
default) and `--no-checkpoints` turns delta-rs's checkpoint hook off: both
show what the node's choices save. On a local disk the commits are the
appender's own (`storage.deltars.LocalLog`) and a thread writes the
checkpoints, as in the node (its CPU is in the figures); `--delta-rs`
makes them delta-rs's, as on an object store, to compare. Through
delta-rs, the PUT log's commits answer before the handle moves to them
(`Appender.append(settle=False)`), as here by default: the single
commits' percentiles are to the answer, and the handle's update after
each is printed apart; `--settle` times both as one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import threading
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from primary.compaction import Compactor
from storage import deltars, tables


def put_batch(rows: int, first_seq: int, size: int, properties: list[list[tuple[str, str]]] | None = None,
              property_types: list[list[tuple[str, str]]] | None = None) -> pa.Table:
    """PUT-log rows as the primary commits them: `size`-byte payloads, the
    given properties and their types per row (none by default)."""
    now = datetime.now(timezone.utc)
    return pa.table({
        "domain": ["bench"] * rows, "queue": ["q"] * rows, "guid": [os.urandom(16) for _ in range(rows)],
        "seq": list(range(first_seq, first_seq + rows)), "payload": [b"x" * size] * rows,
        "properties": pa.array(properties or [[]] * rows, tables.PROPERTY_MAP),
        "property_types": pa.array(property_types or [[]] * rows, tables.PROPERTY_MAP),
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
    parser.add_argument("--no-trim", action="store_true", help="keep every _delta_log entry")
    parser.add_argument("--no-checkpoints", action="store_true", help="no checkpoint in the commit")
    parser.add_argument("--settle", action="store_true",
                        help="each commit updates the handle before it returns (the PUT log's commits answer "
                             "first, then update it: the default here, as the node does)")
    parser.add_argument("--delta-rs", action="store_true",
                        help="commit through delta-rs on a local disk too (the object stores' path)")
    parser.add_argument("--contend", type=int, default=0, metavar="N",
                        help="N more threads that run Python throughout, as a busy node's loop and frame "
                             "threads do: the commits' wall time then shows each time a commit gives the GIL "
                             "up and waits for it again (their CPU is in the per-commit CPU; the commit "
                             "thread's own is printed apart)")
    parser.add_argument("--object-store", action="store_true",
                        help="the table on a SeaweedFS S3 server started for the run, not the local disk")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="taproot-commits-"))
        if args.object_store:
            scratch = _object_store_root(stack, scratch)
        return _run(args, tables.PartitionPaths(scratch, 0).puts)


def _object_store_root(stack: contextlib.ExitStack, scratch: str) -> str:
    """Start a SeaweedFS for the run; this process's delta-rs reaches it."""
    from taproot_ops.object_store import SeaweedFS

    store = stack.enter_context(SeaweedFS(os.path.join(scratch, "s3")))
    store.use_in_this_process()
    print(f"table on SeaweedFS at {store.endpoint}", flush=True)
    return f"s3://{store.bucket}/commits"


def _run(args: argparse.Namespace, path: str) -> int:
    durable = args.durability == "fsync"
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, epoch=1, durable=durable,
                                checkpoints=not args.no_checkpoints, background_checkpoints=not args.delta_rs)
    if args.delta_rs:
        appender.log = None
    compactor = Compactor(path, args.compact_every, "bench", durable=durable,
                          log_retention_s=None if args.no_trim else 0, appender=appender)
    compactor.start()
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(args.contend)]
    for spinner in spinners:
        spinner.start()
    cpu0, wall0, own0 = time.process_time(), time.perf_counter(), time.thread_time()
    single: list[float] = []
    settles: list[float] = []
    try:
        for i in range(1, args.commits + 1):
            batch = put_batch(args.rows, (i - 1) * args.rows, args.size)
            started = time.perf_counter()
            appender.append(batch, settle=args.settle)
            single.append((time.perf_counter() - started) * 1000)
            compactor.on_commit()
            if not args.settle and appender.log is None:
                started = time.perf_counter()
                appender.settle()
                settles.append((time.perf_counter() - started) * 1000)
            appender.reserve()    # the next commit's files, as the node has them made after each
            if i % args.every == 0:
                cpu, wall, own = time.process_time(), time.perf_counter(), time.thread_time()
                logs = f"; {_log_files(path):,} files in _delta_log"
                print(f"commits {i - args.every + 1:,}-{i:,}: {(wall - wall0) * 1000 / args.every:.1f} ms wall, "
                      f"{(cpu - cpu0) * 1000 / args.every:.1f} ms CPU per commit (compaction included), "
                      f"{(own - own0) * 1000 / args.every:.1f} ms the commit thread's{logs}", flush=True)
                cpu0, wall0, own0 = cpu, wall, own
    finally:
        stop.set()
        compactor.stop()
        appender.close()
    p50, p90, p99, top = np.percentile(single, [50, 90, 99, 100])
    print(f"{args.commits:,} commits of {args.rows} x {args.size} B: p50 {p50:.1f} p90 {p90:.1f} p99 {p99:.1f} "
          f"max {top:.1f} ms; last 10: {' '.join(f'{x:.0f}' for x in single[-10:])} ms"
          + ("" if args.settle or not settles else " (to the answer: the handle's update after it below)"))
    print(f"{compactor.compactions} compactions, {compactor.trimmed_log_files} log files trimmed", flush=True)
    if appender.checkpointer is not None:
        print(f"{appender.checkpointer.checkpoints} checkpoints, written by a thread of their own", flush=True)
    if settles:
        p50, p90, p99 = np.percentile(settles, [50, 90, 99])
        print(f"the handle's update after each commit (`Appender.settle`): p50 {p50:.1f} p90 {p90:.1f} "
              f"p99 {p99:.1f} ms")
    return 0


def _spin(stop: threading.Event) -> None:
    """Run Python until `stop` (`--contend`)."""
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1


def _log_files(path: str) -> int:
    import pyarrow.fs as pafs
    store, base = deltars.file_system(path)
    return len(store.get_file_info(pafs.FileSelector(f"{base}/_delta_log")))


if __name__ == "__main__":
    raise SystemExit(main())
