"""What `Queue.post()` costs the producer's process, per PUT: an embedded
cluster (node, proxy, no pipeline) on a temp dir, and one session in this
process posting 1 KiB PUTs as fast as its window allows, with an `on_ack`
callback each.

    .venv/bin/python -m taproot_ops.bench.post_cost [--messages 200000] [--rounds 3] [--client-gc default]
        [--rate 10000]

Prints, per round, the PUTs a second and this process's CPU per PUT (every
thread: the posting one, the session's receiver and flusher, gRPC's), and
the posting thread's share. With `--rate` the PUTs are paced as
`taproot bench --rate` paces them (a sleep once a producer is 1 ms ahead),
and each round also prints the CPU of the session's threads a PUT (the
flusher seals the frames a paced producer's linger makes). The load generator of `taproot bench
--scenario priority-1q` pays this on the same cores as the servers; like
it, this process tunes its collector (`taproot.tune_gc`) after the
warm-up, unless `--client-gc default`. First, with no cluster and no other
thread, what sealing a batch of `post()` PUTs into its frame costs
(`seal_us`: 64 PUTs, about what a producer paced at 10k msg/s puts in a
frame with the 5 ms linger, and 1,000, a full frame).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from taproot.core import QueueRecord, SessionCore


def open_on_core(core: "SessionCore", uri: str, *, read: bool = False, write: bool = False) -> "QueueRecord":
    """`core` connected (no server: its frames are never read) with queue 1,
    `uri`, open: what the in-thread figures of `post_cost` and
    `consume_cost` run the SDK's own paths on."""
    from protocol import pb
    from taproot.core import QueueRecord

    core.connected("bench", 0)
    record = QueueRecord(1, uri, read=read, write=write,
                         open_request=pb.OpenQueue(queue_id=1, uri=uri, read=read, write=write))
    core.add_queue(record)
    core.opened(1, pb.OpenQueueResponse(queue_id=1, status=pb.Status(code=pb.SUCCESS)))
    core.take()
    return record


def seal_us(puts: int, repeats: int = 300, size: int = 1024) -> float:
    """Microseconds (this thread's CPU) to seal a batch of `puts` PUTs of
    one queue into its PutColumns frame (`SessionCore._seal`: the rows
    encoded, the frame held in the retransmission buffer), on a core taken
    as connected; each frame's ACK is answered outside the clock."""
    from protocol import ResultCode, columns
    from taproot.batching import BatchPolicy
    from taproot.core import Put, SessionCore

    core = SessionCore(batch=BatchPolicy(max_messages=puts + 1))
    open_on_core(core, "taproot://bench/seal", write=True)
    payload = b"x" * size
    guid = 0
    sealing = 0.0
    for _ in range(repeats + 1):
        guids = [(guid + i).to_bytes(16, "big") for i in range(puts)]
        guid += puts
        for g in guids:
            core.post(1, Put(g, payload, [], 1, 0), None, 0.0)
        started = time.thread_time()
        core.flush_puts()
        if guid > puts:   # the first round warms up
            sealing += time.thread_time() - started
        assert len(core.take().frames) == 1
        core.on_frame(columns.ack_columns(1, b"".join(guids), ResultCode.SUCCESS, "", {}))
        core.take()
    return sealing / repeats * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="PUTs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--rate", type=float, default=0, help="PUTs a second, paced (default 0: as fast as the "
                        "window allows)")
    parser.add_argument("--client-gc", choices=["tuned", "default"], default="tuned",
                        help="this process's garbage collector: tuned as `taproot.tune_gc` does (default), or "
                             "the interpreter's settings")
    args = parser.parse_args(argv)

    from taproot.batching import BatchPolicy
    from taproot.session import Session
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.runner import pacing_delay
    from taproot_ops.bench.scenarios import SCENARIOS
    from taproot_ops.embedded import EmbeddedCluster

    for puts in (64, 1000):
        us = seal_us(puts)
        print(f"sealing a frame of {puts} PUTs: {us:.0f} us, {us / puts:.2f} us a PUT (one thread, no cluster)",
              flush=True)
    with tempfile.TemporaryDirectory(prefix="taproot-post-cost-") as scratch:
        config = write_bench_config(Path(scratch) / "conf", [SCENARIOS["priority-1q"]])
        print(f"starting a node and a proxy in {scratch} ...", flush=True)
        with EmbeddedCluster(str(config), os.path.join(scratch, "data"), ephemeral_ports=True,
                             with_pipeline=False) as cluster:
            with Session([cluster.client_address], batch=BatchPolicy(max_messages=1000),
                         max_pending_puts=10_000) as session:
                queue = session.open_queue("taproot://bench/post-cost", write=True)
                payload = b"x" * args.size
                acked = threading.Semaphore(0)

                def on_ack(_future: object) -> None:
                    acked.release()

                def one_round(n: int) -> tuple[float, float, float]:
                    threads0 = threads_cpu()
                    wall0, cpu0, mine0 = time.perf_counter(), time.process_time(), time.thread_time()
                    if args.rate:
                        for posted in range(n):
                            delay = pacing_delay(wall0, posted, args.rate, time.perf_counter())
                            if delay:
                                time.sleep(delay)
                            queue.post(payload, on_ack=on_ack)
                    else:
                        for _ in range(n):
                            queue.post(payload, on_ack=on_ack)
                    mine = time.thread_time() - mine0
                    for _ in range(n):
                        acked.acquire()
                    if args.rate and n == args.messages:
                        used = threads_cpu()
                        print("  " + ", ".join(f"{name} {(used[name] - threads0.get(name, 0.0)) / n * 1e6:.1f}"
                                               for name in sorted(used) if name.startswith("taproot-"))
                              + " us a PUT", flush=True)
                    return time.perf_counter() - wall0, time.process_time() - cpu0, mine

                run_rounds(one_round, args.messages, args.rounds, "PUT", "posting",
                           tune_gc=args.client_gc == "tuned")
    return 0


def threads_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's Python threads, by name (a
    name shared by several threads sums them)."""
    used: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ValueError):   # ended meanwhile
            continue
        used[thread.name] = used.get(thread.name, 0.0) + seconds
    return used


def run_rounds(one_round: Callable[[int], tuple[float, float, float]], messages: int, rounds: int, what: str,
               thread: str, tune_gc: bool = True) -> None:
    """A warm-up round (connections, pyarrow, the node's first commits),
    the collector tuned as `taproot.tune_gc` does (unless not `tune_gc`),
    then `rounds` rounds of `messages`, each printed: `what`s a second, and
    the process's CPU a `what` with the `thread` thread's share.
    `one_round(n)` returns its wall, process CPU and own thread's CPU seconds."""
    one_round(20_000)
    if tune_gc:
        import taproot
        taproot.tune_gc()
    for r in range(1, rounds + 1):
        wall, cpu, mine = one_round(messages)
        print(f"round {r}: {messages / wall:,.0f} {what}s/s; {cpu / messages * 1e6:.1f} us of CPU a {what}, "
              f"{mine / messages * 1e6:.1f} of them in the {thread} thread", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
