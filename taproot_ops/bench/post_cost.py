"""What `Queue.post()` costs the producer's process, per PUT: an embedded
cluster (node, proxy, no pipeline) on a temp dir, and one session in this
process posting 1 KiB PUTs as fast as its window allows, with an `on_ack`
callback each.

    .venv/bin/python -m taproot_ops.bench.post_cost [--messages 200000] [--rounds 3] [--client-gc default]

Prints, per round, the PUTs a second and this process's CPU per PUT (every
thread: the posting one, the session's receiver and flusher, gRPC's), and
the posting thread's share. The load generator of `taproot bench
--scenario priority-1q` pays this on the same cores as the servers; like
it, this process tunes its collector (`taproot.tune_gc`) after the
warm-up, unless `--client-gc default`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="PUTs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--client-gc", choices=["tuned", "default"], default="tuned",
                        help="this process's garbage collector: tuned as `taproot.tune_gc` does (default), or "
                             "the interpreter's settings")
    args = parser.parse_args(argv)

    from taproot.batching import BatchPolicy
    from taproot.session import Session
    from taproot_ops.bench import write_bench_config
    from taproot_ops.bench.scenarios import SCENARIOS
    from taproot_ops.embedded import EmbeddedCluster

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
                    wall0, cpu0, mine0 = time.perf_counter(), time.process_time(), time.thread_time()
                    for _ in range(n):
                        queue.post(payload, on_ack=on_ack)
                    mine = time.thread_time() - mine0
                    for _ in range(n):
                        acked.acquire()
                    return time.perf_counter() - wall0, time.process_time() - cpu0, mine

                run_rounds(one_round, args.messages, args.rounds, "PUT", "posting",
                           tune_gc=args.client_gc == "tuned")
    return 0


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
