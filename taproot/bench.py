"""`taproot bench`: PUT->ACK and PUT->PUSH latency and sustained msg/s.

Producer and consumer run in separate processes (spawned: delta-rs's runtime
and gRPC do not survive fork) against an embedded cluster in a temp dir, or a
running one (`--hosts`). Two runs: one paced at `--rate`, one unpaced.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import platform
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


def main(args) -> int:
    cluster = None
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
