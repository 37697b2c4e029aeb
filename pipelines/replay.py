"""Replay: post a queue's history into a queue through the normal PUT path.

    taproot replay --from taproot://demo/orders --to taproot://demo/orders-replay \\
        --since 2026-11-21T10:00:00 --until 2026-11-21T11:00:00 --where "properties['region'] = 'EU'"

A Spark job selects the history from the source queue's delivery log (one row
per message: duplicates were already dropped), by `put_time` range or as of a
table version (time travel), filtered by any Spark SQL predicate over the
delivery log's columns, in PUT order (`seq`). The rows are then posted to the
target queue with the SDK, like any producer: new GUIDs, every PUT ACKed or
counted as failed with its code. Payloads travel as stored (a compressed
payload stays compressed and keeps its compression flag) with their typed
properties.

Rate: as fast as the target accepts (`--rate 0`, the default: columnar PUT
frames of `bulk_rows` messages, each checked, committed and ACKed as a whole),
a fixed rate (`--rate N` msg/s), or the original spacing of the PUTs
(`--original-rate`); the paced modes post message by message.
The history is read in slices of `slice_rows` (by `seq`) so memory stays
bounded whatever its size.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from protocol import ResultCode, parse_queue_uri
from protocol.expression import sql_string
from protocol.properties import maps_to_wire
from storage import tables
from taproot import Session, TaprootError
from taproot.compression import ALGORITHMS

SLICE_ROWS = 100_000
BULK_ROWS = 5_000       # messages per columnar PUT frame at full speed


class ReplayError(ValueError):
    """Bad replay arguments (queue URI, time range, predicate)."""


@dataclass
class ReplayResult:
    selected: int = 0
    posted: int = 0
    acked: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.acked / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        return (f"replayed {self.acked} of {self.selected} selected messages in {self.seconds:.1f} s "
                f"({self.rate:,.0f} msg/s); posted {self.posted}, failed: {failed}")


def select_history(spark, data_dir: str, partitions: int, source: str, *, since: str | None = None,
                   until: str | None = None, version: int | None = None, where: str | None = None):
    """The DataFrame of messages to replay (not yet ordered)."""
    from pyspark.sql import functions as F

    from primary.node import partition_of

    uri = parse_queue_uri(source)
    if isinstance(uri, str):
        raise ReplayError(f"--from {source!r}: {uri}")
    if version is not None and (since or until):
        raise ReplayError("give --version or --since/--until, not both")
    path = tables.PartitionPaths(data_dir, partition_of(uri, partitions)).delivery
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    df = reader.load(path).where((F.col("domain") == uri.domain) & (F.col("queue") == uri.queue))
    for bound, op in ((since, ">="), (until, "<")):
        if bound:
            df = df.where(f"put_time {op} to_timestamp({sql_string(bound)})")
    if where:
        df = df.where(where)
    return df.select("seq", "payload", "properties", "property_types", "compression", "put_time")




class _Pacer:
    """Sleeps to hold a rate, or to keep the original spacing of PUTs."""

    def __init__(self, rate: float, original: bool):
        self.rate, self.original = rate, original
        self.started = time.monotonic()
        self.first_put_us: int | None = None
        self.count = 0

    def wait(self, put_time_us: int) -> None:
        self.count += 1
        if self.original:
            if self.first_put_us is None:
                self.first_put_us = put_time_us
            due = self.started + (put_time_us - self.first_put_us) / 1e6
        elif self.rate > 0:
            due = self.started + self.count / self.rate
        else:
            return
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def replay(spark, data_dir: str, partitions: int, hosts: list[str], source: str, target: str, *,
           since: str | None = None, until: str | None = None, version: int | None = None,
           where: str | None = None, rate: float = 0.0, original_rate: bool = False,
           slice_rows: int = SLICE_ROWS, bulk_rows: int = BULK_ROWS, progress: Callable[[ReplayResult], None] | None = None) -> ReplayResult:
    target_uri = parse_queue_uri(target)
    if isinstance(target_uri, str):
        raise ReplayError(f"--to {target!r}: {target_uri}")
    history = select_history(spark, data_dir, partitions, source, since=since, until=until, version=version,
                             where=where).cache()
    result = ReplayResult()
    try:
        bounds = history.selectExpr("count(*) AS n", "min(seq) AS lo", "max(seq) AS hi").first()
        result.selected = int(bounds.n)
        started = time.monotonic()
        if result.selected == 0:
            return result
        pacer = _Pacer(rate, original_rate)
        with Session(hosts) as session, session.open_queue(target, write=True) as queue:
            futures: list[tuple[Future, int]] = []
            last_report = 0.0
            # Slices by seq, fetched one ahead of the posting; each is sorted in
            # Arrow on the driver (a Spark sort would shuffle: 3-10x slower here).
            starts = range(int(bounds.lo), int(bounds.hi) + 1, slice_rows)

            def fetch(lo: int) -> pa.Table:
                return history.where(f"seq >= {lo} AND seq < {lo + slice_rows}").toArrow().sort_by("seq")

            with ThreadPoolExecutor(1, thread_name_prefix="replay-fetch") as fetcher:
                ahead = [fetcher.submit(fetch, lo) for lo in starts[:1]]
                for n, _ in enumerate(starts):
                    chunk = ahead.pop(0).result()
                    if n + 1 < len(starts):
                        ahead.append(fetcher.submit(fetch, starts[n + 1]))
                    if rate or original_rate:
                        futures.extend((f, 1) for f in _post_slice(queue, chunk, pacer, ALGORITHMS))
                    else:  # full speed: columnar frames, checked and committed as a whole
                        for start in range(0, chunk.num_rows, bulk_rows):
                            part = chunk.slice(start, bulk_rows)
                            futures.append((queue.post_columns(part), part.num_rows))
                    result.posted += chunk.num_rows
                    futures = _settle(futures, result, block=False)
                    if progress is not None and time.monotonic() - last_report > 0.5:
                        result.seconds = time.monotonic() - started
                        progress(result)
                        last_report = time.monotonic()
            queue.flush()
            _settle(futures, result, block=True)
        result.seconds = time.monotonic() - started
        if progress is not None:
            progress(result)
        return result
    finally:
        history.unpersist()


def _post_slice(queue, chunk: pa.Table, pacer: _Pacer, codes: dict[str, int]) -> list:
    columns = {name: chunk[name].to_pylist() for name in ("payload", "properties", "property_types",
                                                          "compression")}
    put_us = chunk["put_time"].cast(pa.int64()).to_pylist()
    post = queue._session._post  # the stored bytes as they are: no re-compression, no re-validation
    futures = []
    for i in range(chunk.num_rows):
        pacer.wait(put_us[i])
        futures.append(post(queue, columns["payload"][i],
                            maps_to_wire(columns["properties"][i], columns["property_types"][i]), None,
                            codes.get(columns["compression"][i] or "", 0)))
    return futures


def _settle(futures: list, result: ReplayResult, block: bool) -> list:
    """Count finished (future, messages) pairs; return the ones still waiting."""
    waiting = []
    for future, count in futures:
        if not block and not future.done():
            waiting.append((future, count))
            continue
        try:
            future.result(timeout=120)
            result.acked += count
        except TaprootError as exc:
            code = getattr(exc, "code", ResultCode.UNKNOWN)
            name = code.name if isinstance(code, ResultCode) else str(code)
            result.failed[name] = result.failed.get(name, 0) + count
        except TimeoutError:
            result.failed["TIMEOUT"] = result.failed.get("TIMEOUT", 0) + count
    return waiting


def print_progress(result: ReplayResult) -> None:
    done = result.acked + sum(result.failed.values())
    width = 30
    filled = int(width * done / result.selected) if result.selected else width
    rate = done / result.seconds if result.seconds else 0.0
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{result.selected} "
                     f"acked {result.acked} failed {sum(result.failed.values())} {rate:,.0f} msg/s")
    sys.stderr.flush()
    if done >= result.selected:
        sys.stderr.write("\n")
