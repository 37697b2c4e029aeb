"""What a per-message consumer costs its process, per message: an embedded
cluster (node, proxy, no pipeline) on a temp dir; a producer session posts
a backlog of 1 KiB messages in bulk, then a consumer session in this
process takes them one at a time (`Queue.get`) and confirms each
(`Message.confirm`), as `taproot bench --scenario priority-1q`'s consumer
does.

    .venv/bin/python -m taproot_ops.bench.consume_cost [--messages 200000] [--rounds 3] [--window 1000]

Prints, per round, the messages a second and this process's CPU per
message (every thread: the reading one, the session's receiver and
flusher, gRPC's), and the reading thread's share. The producer is idle
while the consumer reads: its backlog is posted and ACKed before the
round's clock starts. First, with no cluster and no other thread, what
making a PUSH frame's rows into `Message`s costs (`table_messages`, 1,000
rows without properties) and what a `confirm()` costs: the steadiest of
these figures on a machine whose speed varies.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def rows_to_messages_us(rows: int = 1000, repeats: int = 300, size: int = 1024) -> float:
    """Microseconds (this thread's CPU) a message to make `rows` rows of a
    PUSH frame into `Message`s."""
    import pyarrow as pa

    from protocol import columns
    from taproot.message import BATCH_SCHEMA, table_messages

    table = pa.table({
        "guid": pa.array([i.to_bytes(16, "big") for i in range(rows)], pa.binary()),
        "seq": pa.array(range(rows), pa.int64()), "payload": pa.array([b"x" * size] * rows, pa.binary()),
        "properties": pa.array([[]] * rows, columns.PROPERTY_MAP),
        "property_types": pa.array([[]] * rows, columns.PROPERTY_MAP),
        "put_time_us": pa.array([1] * rows, pa.int64()), "delivery_count": pa.array([1] * rows, pa.int32()),
        "compression": pa.nulls(rows, pa.string())}, schema=BATCH_SCHEMA)

    class Queue:
        uri = "taproot://bench/rows"

    queue = Queue()
    table_messages(table, queue)  # type: ignore[arg-type]
    started = time.thread_time()
    for _ in range(repeats):
        table_messages(table, queue)  # type: ignore[arg-type]
    return (time.thread_time() - started) / (repeats * rows) * 1e6


def confirm_us(messages: int = 1000, repeats: int = 200) -> float:
    """Microseconds (this thread's CPU) a per-message `Message.confirm()`
    costs, on a session whose stream is taken as up and never read (no
    server): the lock, the core's batching, a CONFIRM frame a thousand."""
    from taproot.message import _message
    from taproot.session import Queue, Session
    from taproot_ops.bench.post_cost import open_on_core

    session = Session(["127.0.0.1:1"])
    record = open_on_core(session._core, "taproot://bench/confirm", read=True)
    queue = Queue(session, record, None)
    batch = [_message(i.to_bytes(16, "big"), b"x", {}, queue.uri, 1, i, 1, None, queue) for i in range(messages)]

    def confirm_all() -> None:
        for message in batch:
            message.confirm()
        session._out = type(session._out)()   # the frames sent: nobody reads them

    confirm_all()
    started = time.thread_time()
    for _ in range(repeats):
        confirm_all()
    return (time.thread_time() - started) / (repeats * messages) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--window", type=int, default=1000, help="the consumer's max unconfirmed messages")
    args = parser.parse_args(argv)

    import pyarrow as pa

    from taproot.session import Session
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.post_cost import run_rounds
    from taproot_ops.bench.scenarios import SCENARIOS
    from taproot_ops.embedded import EmbeddedCluster

    print(f"in this thread alone: rows to Messages {rows_to_messages_us(size=args.size):.2f} us a message, "
          f"a CONFIRM {confirm_us():.2f} us", flush=True)
    uri = "taproot://bench/consume-cost"
    with tempfile.TemporaryDirectory(prefix="taproot-consume-cost-") as scratch:
        config = write_bench_config(Path(scratch) / "conf", [SCENARIOS["priority-1q"]])
        print(f"starting a node and a proxy in {scratch} ...", flush=True)
        with EmbeddedCluster(str(config), os.path.join(scratch, "data"), ephemeral_ports=True,
                             with_pipeline=False) as cluster, \
                Session([cluster.client_address]) as producer_session, \
                Session([cluster.client_address]) as consumer_session:
            producer = producer_session.open_queue(uri, write=True)
            consumer = consumer_session.open_queue(uri, read=True, max_unconfirmed_messages=args.window)
            payload = pa.array([b"x" * args.size] * 1000, pa.binary())

            def backlog(n: int) -> None:
                futures = [producer.post_columns(pa.table({"payload": payload})) for _ in range(n // 1000)]
                for future in futures:
                    future.result(timeout=120)

            def one_round(n: int) -> tuple[float, float, float]:
                backlog(n)
                wall0, cpu0, mine0 = time.perf_counter(), time.process_time(), time.thread_time()
                for _ in range(n):
                    message = consumer.get(timeout_s=30)
                    if message is None:
                        raise SystemExit("no message within 30 s: the backlog did not arrive")
                    message.confirm()
                consumer.flush()
                return time.perf_counter() - wall0, time.process_time() - cpu0, time.thread_time() - mine0

            run_rounds(one_round, args.messages, args.rounds, "message", "reading")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
