"""`taproot bench --replay N`: fill a queue, then time `taproot replay` of it."""

from __future__ import annotations

import time
from typing import Any


def fill(address: str, uri: str, count: int, size: int, frame: int = 5_000) -> float:
    """Post `count` messages of `size` bytes with columnar frames; return msg/s."""
    import pyarrow as pa

    from taproot import Session

    started = time.monotonic()
    with Session([address]) as session, session.open_queue(uri, write=True) as queue:
        futures = [queue.post_columns(pa.table({"payload": pa.array([b"x" * size] * min(frame, count - i),
                                                                    pa.binary())}))
                   for i in range(0, count, frame)]
        for future in futures:
            future.result(timeout=600)
    return count / (time.monotonic() - started)


def _delivered(data_dir: str, partitions: int, uri: str) -> int:
    from protocol import parse_queue_uri
    from protocol.uri import partition_of
    from storage import deltars, tables

    parsed = parse_queue_uri(uri)
    assert not isinstance(parsed, str)
    table = deltars.try_open(tables.PartitionPaths(data_dir, partition_of(parsed, partitions)).delivery)
    if table is None:
        return 0
    rows = table.to_pyarrow_table(columns=["queue"], filters=[("domain", "=", parsed.domain),
                                                              ("queue", "=", parsed.queue)])
    return int(rows.num_rows)


def _wait_delivered(data_dir: str, partitions: int, uri: str, count: int, timeout_s: float = 900) -> float:
    started = time.monotonic()
    while _delivered(data_dir, partitions, uri) < count:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{uri}: not delivered within {timeout_s:.0f} s")
        time.sleep(1)
    time.sleep(3)  # let the primary route the last rows before the next measurement
    return time.monotonic() - started


def replay_scenario(address: str, data_dir: str, partitions: int, uri: str, count: int, size: int,
                    connect_url: str | None = None) -> dict[str, Any]:
    """Fill a queue, let the pipeline deliver it, then replay it: on the
    pipeline's Spark Connect endpoint (`connect_url`: the warm engine
    `taproot replay` uses when the cluster runs), then twice on a Spark of
    its own (a fresh session, as `taproot replay` starts without an endpoint,
    then the same one warm)."""
    from pipelines.replay import replay
    from storage.spark import remote_session, session

    print(f"replay: posting {count:,} x {size} B to {uri} ...", flush=True)
    out: dict[str, Any] = {"messages": count, "size": size, "fill_msg_s": fill(address, uri, count, size)}
    print(f"   filled at {out['fill_msg_s']:,.0f} msg/s; waiting for the pipeline to deliver them", flush=True)
    out["fill_delivered_s"] = _wait_delivered(data_dir, partitions, uri, count)

    def measure(run: str, spark: Any) -> None:
        started = time.monotonic()
        target = f"{uri}-replay-{run}"
        result = replay(spark, data_dir, partitions, [address], uri, target)
        print(f"   {run}: {result.summary()}", flush=True)
        _wait_delivered(data_dir, partitions, target, count)
        delivered_s = time.monotonic() - started
        print(f"   the pipeline had delivered all {count:,} replayed messages {delivered_s:.1f} s after the "
              f"replay started", flush=True)
        out[run] = {"acked": result.acked, "failed": result.failed, "post_seconds": result.seconds,
                    "select_seconds": result.select_seconds, "post_msg_s": result.rate,
                    "overall_msg_s": result.acked / (result.seconds + result.select_seconds),
                    "delivered_seconds": delivered_s}

    if connect_url is not None:
        with remote_session(connect_url) as remote:   # a local session may start after it
            measure("endpoint", remote)
    spark = session("taproot-bench-replay")
    try:
        for run in ("cold", "warm"):
            measure(run, spark)
    finally:
        spark.stop()
    return out
