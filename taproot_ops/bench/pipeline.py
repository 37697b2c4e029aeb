"""`taproot bench --pipeline N`: the dedup pipeline alone, per row.

The pipeline's share of the server CPU is hard to read from a short
end-to-end run: its JVM compiles while the run goes, and it competes with the
node for the same cores. This measures it alone, in one Spark session, with
the query the pipeline runs (`start_dedup_query`, trigger availableNow): a
warm-up pass over 100,000 rows (class loading and the JIT), then `passes`
passes over N rows each. Each pass is a fresh partition whose PUT log is
written beforehand the way the primary writes it (delta-rs, one commit per
`--batch` rows, 1 KiB payloads unless `--size`).

A pass's CPU is the JVM's (user + system, from /proc) from the query's start
to its end, so it includes the query's start and planning, which a
long-running query pays once: an upper bound on the steady per-row cost.
The passes differ by a few µs per row (GC, late JIT); the median is reported.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from pathlib import Path
from typing import Any

WARM_UP_ROWS = 100_000
RECENT_PROGRESS = 100   # a query keeps this many batches' progress (spark.sql.streaming.numRecentProgressUpdates)


def _jvm_cpu_s() -> float:
    """CPU seconds of this process's children (the Spark JVM) and their children."""
    from taproot_ops.bench.cpu import tree_cpu_seconds
    return tree_cpu_seconds({"self": os.getpid()}).get("self", 0.0) - _own_cpu_s()


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def write_put_log(path: str, rows: int, per_commit: int, size: int) -> int:
    """A PUT log of `rows` rows in commits of `per_commit`, as the primary writes it."""
    import pyarrow as pa

    from storage import deltars, tables

    deltars.open_or_create(path, tables.PUTS_SCHEMA)
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    payload = pa.array([b"x" * size] * per_commit, pa.binary())
    empty_map = pa.array([[]] * per_commit, tables.PROPERTY_MAP)
    commits = 0
    for start in range(0, rows, per_commit):
        n = min(per_commit, rows - start)
        now = pa.array([dt.datetime.now(dt.timezone.utc)] * n, tables.TIMESTAMP)
        appender.append(pa.table({
            "domain": pa.array(["bench"] * n), "queue": pa.array(["q"] * n),
            "guid": pa.array([os.urandom(16) for _ in range(n)], pa.binary()),
            "seq": pa.array(range(start, start + n), pa.int64()), "payload": payload.slice(0, n),
            "properties": empty_map.slice(0, n), "property_types": empty_map.slice(0, n),
            "producer_time": now, "put_time": now, "epoch": pa.array([1] * n, pa.int64()),
            "compression": pa.nulls(n, pa.string())}, schema=tables.PUTS_SCHEMA))
        commits += 1
    return commits


def _dedup_over_put_log(spark: Any, root: Path, name: str, rows: int, per_commit: int, size: int,
                        history_window_ms: int, max_files_per_trigger: int = 1000) -> dict[str, Any]:
    """Write a PUT log of `rows` rows under `root/name`, then run the dedup
    query over it to the end (availableNow). Returns its paths, query,
    commits, wall time and the JVM's CPU."""
    from pipelines.dedup import start_dedup_query
    from pipelines.runner import create_delivery_table
    from storage.tables import PartitionPaths

    paths = PartitionPaths(str(root / name), 0)
    Path(paths.puts).parent.mkdir(parents=True, exist_ok=True)
    print(f"  {name}: writing a PUT log of {rows:,} rows in commits of {per_commit:,} ...", flush=True)
    commits = write_put_log(paths.puts, rows, per_commit, size)
    create_delivery_table(spark, paths.delivery)
    cpu, started = _jvm_cpu_s(), time.monotonic()
    query = start_dedup_query(spark, paths, history_window_ms, available_now=True,
                              max_files_per_trigger=max_files_per_trigger)
    query.awaitTermination()
    return {"paths": paths, "query": query, "commits": commits, "wall_s": time.monotonic() - started,
            "jvm_cpu_s": _jvm_cpu_s() - cpu}


def _pass(spark: Any, root: Path, name: str, rows: int, per_commit: int, size: int,
          history_window_ms: int) -> dict[str, Any]:
    run = _dedup_over_put_log(spark, root, name, rows, per_commit, size, history_window_ms)
    result = {"rows": rows, "commits": run["commits"], "wall_s": run["wall_s"], "jvm_cpu_s": run["jvm_cpu_s"],
              "batches": [(p["numInputRows"], p["durationMs"].get("addBatch")) for p in run["query"].recentProgress]}
    delivered = spark.read.format("delta").load(run["paths"].delivery).count()
    if delivered != rows:
        raise RuntimeError(f"{name}: {delivered:,} delivery rows for {rows:,} PUTs")
    print(f"  {name}: {rows:,} rows in {result['wall_s']:.1f} s, JVM CPU {result['jvm_cpu_s']:.1f} s", flush=True)
    return result


def pipeline_cost(rows: int, per_commit: int, size: int, passes: int = 3,
                  history_window_ms: int = 300_000) -> dict[str, Any]:
    from storage import spark as spark_factory

    if rows < per_commit:
        raise ValueError(f"--pipeline needs at least one commit of --batch rows ({per_commit:,})")
    with tempfile.TemporaryDirectory(prefix="taproot-bench-pipeline-") as work:
        print("starting Spark (local mode; Delta's jars on first use) ...", flush=True)
        spark = spark_factory.session("taproot-bench-pipeline", shuffle_partitions=2)
        try:
            root = Path(work)
            _pass(spark, root, "warm-up", WARM_UP_ROWS, per_commit, size, history_window_ms)
            runs = [_pass(spark, root, f"pass {i + 1}", rows, per_commit, size, history_window_ms)
                    for i in range(passes)]
        finally:
            spark.stop()
    per_row = sorted(r["jvm_cpu_s"] / r["rows"] * 1e6 for r in runs)
    return {"rows": rows, "rows_per_commit": per_commit, "size": size, "passes": runs,
            "cpu_us_per_row": per_row, "median_cpu_us_per_row": per_row[len(per_row) // 2],
            "median_rows_per_s": sorted(r["rows"] / r["wall_s"] for r in runs)[len(runs) // 2]}


def print_pipeline_cost(result: dict[str, Any]) -> None:
    print(f"pipeline alone, {result['size']:,} B rows in PUT commits of {result['rows_per_commit']:,}, "
          f"{len(result['passes'])} passes of {result['rows']:,} rows: median "
          f"{result['median_rows_per_s']:,.0f} rows/s, JVM CPU {result['median_cpu_us_per_row']:.1f} us per row "
          f"(passes: {', '.join(f'{v:.1f}' for v in result['cpu_us_per_row'])}; each with its query's start)",
          flush=True)


def history_cost(rows: int, per_commit: int, per_batch: int, size: int,
                 history_window_ms: int = 300_000) -> dict[str, Any]:
    """`taproot bench --history N`: what the dedup costs as its GUID history
    grows. One query over a PUT log of N rows (all inside the window), in
    micro-batches of `per_batch` rows; per batch, the GUIDs its state holds
    after it and the task time spent expiring them. Spark's
    `dropDuplicatesWithinWatermark` scans its whole state for expired GUIDs
    after every micro-batch, whether or not any expired, so that time grows
    with the history, not with the batch."""
    from pipelines.runner import DedupState
    from storage import spark as spark_factory

    if per_batch < per_commit or rows < per_batch:
        raise ValueError(f"--history needs N >= --per-batch ({per_batch:,}) >= --batch ({per_commit:,})")
    if -(-rows // per_batch) > RECENT_PROGRESS:
        raise ValueError(f"--history reads the batches from Spark's last {RECENT_PROGRESS} progress reports: "
                         f"N / --per-batch must be at most {RECENT_PROGRESS}")
    with tempfile.TemporaryDirectory(prefix="taproot-bench-history-") as work:
        print("starting Spark (local mode; Delta's jars on first use) ...", flush=True)
        spark = spark_factory.session("taproot-bench-history", shuffle_partitions=2)
        try:
            run = _dedup_over_put_log(spark, Path(work), "history", rows, per_commit, size, history_window_ms,
                                      max_files_per_trigger=per_batch // per_commit)
            batches, held = [], 0     # one fresh query: its count of the GUIDs held is exact
            for progress in run["query"].recentProgress:
                state = DedupState.of(progress)
                held = state.held_after(held) if state else held
                operators = progress.get("stateOperators") or [{}]
                batches.append({"rows": progress["numInputRows"], "history": held,
                                "eviction_ms": state.eviction_ms if state else 0,
                                "updates_ms": sum(int(o.get("allUpdatesTimeMs", 0)) for o in operators),
                                "batch_ms": progress["durationMs"].get("triggerExecution")})
        finally:
            spark.stop()
    return {"rows": rows, "rows_per_commit": per_commit, "rows_per_batch": per_batch, "size": size,
            "wall_s": run["wall_s"], "jvm_cpu_s": run["jvm_cpu_s"], "batches": batches}


def print_history_cost(result: dict[str, Any]) -> None:
    print(f"dedup history: {result['rows']:,} rows in micro-batches of {result['rows_per_batch']:,}; "
          f"JVM CPU {result['jvm_cpu_s']:.1f} s in {result['wall_s']:.1f} s "
          f"({result['jvm_cpu_s'] / result['rows'] * 1e6:.1f} us per row, JIT and start included)")
    print(f"  {'batch':>5} {'rows':>9} {'history GUIDs':>13} {'batch ms':>9} {'dedup tasks ms':>14} "
          f"{'expiring ms':>11} {'us/history GUID':>15}")
    for i, b in enumerate(result["batches"]):
        per_guid = b["eviction_ms"] * 1000 / b["history"] if b["history"] else 0.0
        print(f"  {i:>5} {b['rows']:>9,} {b['history']:>13,} {b['batch_ms'] or 0:>9,} {b['updates_ms']:>14,} "
              f"{b['eviction_ms']:>11,} {per_guid:>15.2f}")
    print("  (task times are summed over the shuffle partitions' tasks, which run in parallel)", flush=True)
