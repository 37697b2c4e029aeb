"""The authority's lag: from a PUT's commit to its row in the pipeline's
delivery log, read from the tables after a run (delta-rs, no JVM).

With the express lane, consumers get a message right after its commit; the
pipeline, which stays the authority on dedup and fanout, writes its decision
seconds later. This is how much later: per delivery row, `delivered_time -
put_time` (both stamped on this machine: `put_time` by the primary as it
builds the commit, `delivered_time` by Spark as it writes the batch). Also
counted: the disagreements the primaries recorded over the same rows.
"""

from __future__ import annotations

import threading
import time
from array import array
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import deltars, tables
from taproot_ops.bench.report import Samples, time_series


def _rows(data_dir: str, partitions: int, domain: str, since: datetime,
          path_of: Callable[[tables.PartitionPaths], str], columns: list[str],
          time_column: str) -> pa.Table:
    parts = []
    for p in range(partitions):
        table = deltars.try_open(path_of(tables.PartitionPaths(data_dir, p)))
        if table is None:
            continue
        rows = deltars.without_views(table.to_pyarrow_table(columns=columns, filters=[
            ("domain", "=", domain), (time_column, ">=", since)]))
        parts.append(rows)
    return pa.concat_tables(parts) if parts else pa.table({})


def authority_lag(data_dir: str, partitions: int, domain: str, since_s: float, expected: int,
                  timeout_s: float = 600.0, idle_s: float = 60.0, progress: bool = True,
                  on_progress: Callable[[int], None] | None = None,
                  stop: threading.Event | None = None) -> dict[str, Any]:
    """Wait (up to `timeout_s`, or `idle_s` without a new row) until the
    delivery log has `expected` rows of `domain` put since `since_s`, then
    return the lag's percentiles, the rows seen, the wait, and the
    disagreements recorded for those PUTs. `progress` prints a line of its
    own; `on_progress` is given the rows seen so far instead. `stop` ends
    the wait early."""
    since = datetime.fromtimestamp(since_s, timezone.utc)
    started = last_change = time.monotonic()
    rows, seen = pa.table({}), -1
    while True:
        rows = _rows(data_dir, partitions, domain, since, lambda p: p.delivery, ["put_time", "delivered_time"],
                     "put_time")
        if rows.num_rows != seen:
            seen, last_change = rows.num_rows, time.monotonic()
            if on_progress is not None:
                on_progress(seen)
        now = time.monotonic()
        if seen >= expected or now - started > timeout_s or now - last_change > idle_s:
            break
        if stop is not None and stop.is_set():
            break
        if progress:
            print(f"\r  waiting for the pipeline: {seen:,} of {expected:,} delivery rows "
                  f"({now - started:.0f} s)   ", end="", flush=True)
        time.sleep(1.0)
    if progress:
        print("\r" + " " * 72 + "\r", end="", flush=True)
    lag: dict[str, float | None] = {"p50": None, "p99": None, "max": None}
    minutes = time_series(Samples(), since_s, 60.0)
    if rows.num_rows:
        ms = lag_ms(rows)
        lag = {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "max": float(ms.max())}
        minutes = by_minute(rows["put_time"], ms, since_s)
    disagreements = _rows(data_dir, partitions, domain, since, lambda p: p.disagreements, ["seq"], "detected_time")
    return {"lag_ms": lag, "minutes": minutes, "rows": seen, "expected": expected,
            "waited_s": time.monotonic() - started, "disagreements": disagreements.num_rows}


def lag_ms(rows: pa.Table) -> np.ndarray:
    """Each delivery row's `delivered_time - put_time`, in ms."""
    return np.asarray(pc.divide(pc.subtract(rows["delivered_time"].cast(pa.int64()),
                                            rows["put_time"].cast(pa.int64())), 1000.0).to_numpy(), np.float64)


def by_minute(put_time: pa.Array, ms: np.ndarray, since_s: float) -> dict[str, list[float]]:
    """The lag (`ms`, one per row) by minute of the rows' `put_time` in the
    run, from `since_s` (`report.time_series`): whether the authority keeps
    up, or falls further behind as the run goes on."""
    seconds = put_time.cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e6
    return time_series(Samples(array("d", seconds), array("d", ms)), since_s, 60.0)
