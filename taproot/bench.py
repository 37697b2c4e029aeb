"""`taproot bench`: PUT->ACK and PUT->PUSH latency and sustained msg/s.

Producer and consumer run in separate processes (spawned: delta-rs's runtime
and gRPC do not survive fork) against an embedded cluster in a temp dir, or a
running one (`--hosts`). Two runs: one paced at `--rate`, one unpaced.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time

from taproot import loadgen


def _consume(address, uri, count, queue):
    result = loadgen.consume(address, uri, count, idle_timeout_s=120, max_unconfirmed_messages=10_000)
    queue.put(("consume", result.received, result.push_latency_ms, result.elapsed_s))


def _produce(address, uri, count, size, rate, queue):
    result = loadgen.produce(address, uri, count, size=size, rate=rate)
    queue.put(("produce", result.acked, result.failed, result.ack_latency_ms, result.elapsed_s))


def run_once(address: str, uri: str, count: int, size: int, rate: float) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    consumer = ctx.Process(target=_consume, args=(address, uri, count, results))
    consumer.start()
    time.sleep(3)  # let the consumer attach before the first PUT
    producer = ctx.Process(target=_produce, args=(address, uri, count, size, rate, results))
    producer.start()
    out: dict = {}
    for _ in range(2):
        item = results.get(timeout=900)
        if item[0] == "produce":
            _, acked, failed, ack_ms, elapsed = item
            out.update(acked=acked, failed=failed, produce_msg_s=acked / elapsed if elapsed else 0,
                       ack_ms={q: loadgen.percentile(ack_ms, q) for q in (50, 90, 99, 100)})
        else:
            _, received, push_ms, elapsed = item
            out.update(received=received, consume_msg_s=received / elapsed if elapsed else 0,
                       push_ms={q: loadgen.percentile(push_ms, q) for q in (50, 90, 99, 100)})
    producer.join(30)
    consumer.join(30)
    return out


def _print(name: str, r: dict) -> None:
    fmt = lambda d: " ".join(f"p{q if q != 100 else 'max'}={v:.1f}" for q, v in d.items())  # noqa: E731
    print(f"{name}: acked {r['acked']} (failed {r['failed']}), received {r['received']}")
    print(f"   produce {r['produce_msg_s']:,.0f} msg/s   consume {r['consume_msg_s']:,.0f} msg/s")
    print(f"   PUT->ACK  ms {fmt(r['ack_ms'])}")
    print(f"   PUT->PUSH ms {fmt(r['push_ms'])}")


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
    from primary.node import partition_of
    from protocol import parse_queue_uri
    from storage import deltars, tables

    parsed = parse_queue_uri(uri)
    assert not isinstance(parsed, str)
    table = deltars.try_open(tables.PartitionPaths(data_dir, partition_of(parsed, partitions)).delivery)
    if table is None:
        return 0
    return table.to_pyarrow_table(columns=["queue"], filters=[("domain", "=", parsed.domain),
                                                              ("queue", "=", parsed.queue)]).num_rows


def _wait_delivered(data_dir: str, partitions: int, uri: str, count: int, timeout_s: float = 900) -> float:
    started = time.monotonic()
    while _delivered(data_dir, partitions, uri) < count:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{uri}: not delivered within {timeout_s:.0f} s")
        time.sleep(1)
    time.sleep(3)  # let the primary route the last rows before the next measurement
    return time.monotonic() - started


def replay_scenario(address: str, data_dir: str, partitions: int, uri: str, count: int, size: int) -> dict:
    """Fill a queue, let the pipeline deliver it, then replay it twice (a
    fresh Spark session, as `taproot replay` runs, then a warm one)."""
    from pipelines.replay import replay
    from storage.spark import session

    print(f"replay: posting {count:,} x {size} B to {uri} ...", flush=True)
    out: dict = {"messages": count, "size": size, "fill_msg_s": fill(address, uri, count, size)}
    print(f"   filled at {out['fill_msg_s']:,.0f} msg/s; waiting for the pipeline to deliver them", flush=True)
    out["fill_delivered_s"] = _wait_delivered(data_dir, partitions, uri, count)
    spark = session("taproot-bench-replay")
    try:
        for run in ("cold", "warm"):
            started = time.monotonic()
            target = f"{uri}-replay-{run}"
            result = replay(spark, data_dir, partitions, [address], uri, target)
            print(f"   {run} JVM: {result.summary()}", flush=True)
            _wait_delivered(data_dir, partitions, target, count)
            delivered_s = time.monotonic() - started
            print(f"   the pipeline had delivered all {count:,} replayed messages {delivered_s:.1f} s after the "
                  f"replay started", flush=True)
            out[run] = {"acked": result.acked, "failed": result.failed, "post_seconds": result.seconds,
                        "select_seconds": result.select_seconds, "post_msg_s": result.rate,
                        "overall_msg_s": result.acked / (result.seconds + result.select_seconds),
                        "delivered_seconds": delivered_s}
    finally:
        spark.stop()
    return out


def main(args) -> int:
    cluster = None
    if args.replay and args.hosts and not args.data_dir:
        print("error: --replay with --hosts needs the cluster's --data-dir", file=sys.stderr)
        return 2
    if args.hosts:
        address = args.hosts[0]
    else:
        from taproot.embedded import EmbeddedCluster
        data_dir = args.data_dir or tempfile.mkdtemp(prefix="taproot-bench-")
        print(f"starting an embedded cluster in {data_dir} ...", flush=True)
        cluster = EmbeddedCluster(args.config, data_dir, ephemeral_ports=True)
        cluster.start()
        address = cluster.client_address
    try:
        if args.replay:
            import conf
            config = cluster.config if cluster else conf.load(args.config, data_dir=args.data_dir)
            results = replay_scenario(address, os.path.abspath(config.data_dir), config.partitions,
                                      args.uri + "-history", args.replay, args.size)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(results, fh, indent=2)
            return 0
        print("warm-up (JVM, caches) ...", flush=True)
        run_once(address, args.uri + "-warmup", 2000, args.size, 1000)
        results = {"machine": {"cpus": mp.cpu_count(), "python": platform.python_version(),
                               "platform": platform.platform()},
                   "size": args.size}
        count = int(max(1, args.rate) * args.duration)
        print(f"latency run: {count} x {args.size} B at {args.rate:,.0f} msg/s", flush=True)
        results["paced"] = run_once(address, args.uri + "-paced", count, args.size, args.rate)
        _print("paced", results["paced"])
        count = int(20_000 * args.duration / 10)
        print(f"throughput run: {count} x {args.size} B, unpaced", flush=True)
        results["max"] = run_once(address, args.uri + "-max", count, args.size, 0)
        _print("max rate", results["max"])
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh, indent=2)
        return 0
    finally:
        if cluster is not None:
            cluster.stop()
