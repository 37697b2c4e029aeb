"""What a node's process spends per message when a session's frames span
many queues: a node in this process (one partition, real delta-rs tables,
no sockets, no pipeline) and one link that opens Q queues for reading and
writing, then, per round, posts F PUT frames (one by default) of R 1 KiB
rows spread over the queues (a row per queue when R <= Q, as a session of
thousands of queues sends them), reads the ACKs and the PUSH frames, and
confirms them in one CONFIRM frame of their ranges, as the SDK does.

    .venv/bin/python -m taproot_ops.bench.node_cost [--queues 1 2000] [--rows 500] [--rounds 100]
        [--frames F]

`--frames 5 --rows 50` is what a paced producer sends: the frames of a
round arrive together, so one group commit takes them (the linger is 2 ms),
and the per-frame and per-commit costs show at a small frame's size.

Prints, per queue count, the process's CPU per message (every thread: the
commit threads, dispatch, the Delta commits, and this driver's own frame
building, which is the same for every Q), and the time `on_frame` takes for
the PUT and the CONFIRM frames; then where the node's threads spent their
CPU, phase by phase (`PHASES`: each a method, timed by its calling
thread's CPU clock, a phase inside another shown under it). The ratio between the rows is what
`taproot bench --scenario queues` measures with real processes; this one
isolates the node's per-queue Python from the proxy, the pipeline and the
clients.
"""

from __future__ import annotations

import functools
import importlib
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, cast

WARM_UP_ROUNDS = 5
FRAME_WAIT_S = 30

# The node's work by phase: (label, module, class, method). A PUT commit's
# parts, the CONFIRM frame's dispatch (on the thread that handles the frame)
# and the CONFIRM commit. A phase called inside another is reported inside
# it ("PUT commit > Delta append"), so the parts of one never count twice.
PHASES = (
    ("PUT commit", "primary.partition", "Partition", "_commit_puts"),
    ("rows", "primary.partition", "Partition", "_put_batch"),
    ("Delta append", "storage.deltars", "Appender", "append"),
    ("express decisions", "primary.partition", "Partition", "_express"),
    ("routing", "primary.partition", "Partition", "_route_targets"),
    ("PUSH frames", "primary.partition", "Partition", "_push"),
    ("CONFIRM dispatch", "primary.partition", "Partition", "confirm_ranges"),
    ("CONFIRM dispatch", "primary.partition", "Partition", "confirm_held"),   # (its ledger way)
    ("CONFIRM commit", "primary.partition", "Partition", "_commit_confirms"),
)


class PhaseClock:
    """Thread CPU per phase (`PHASES`), while installed: each phase's method
    is wrapped on its class, so install it before the node is made (a
    partition hands its committers bound methods when it starts)."""

    def __init__(self, phases: tuple[tuple[str, str, str, str], ...] = PHASES):
        self.phases = phases
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> "PhaseClock":
        for label, module, cls, name in self.phases:
            owner = getattr(importlib.import_module(module), cls)
            original = owner.__dict__[name]
            self._saved.append((owner, name, original))
            setattr(owner, name, self._timed(label, original))
        return self

    def __exit__(self, *_: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()

    def _timed(self, label: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack: list[str] = self._local.__dict__.setdefault("stack", [])
            stack.append(label)
            started = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                took = time.thread_time() - started
                path = " > ".join(stack)
                stack.pop()
                with self._lock:
                    self.seconds[path] = self.seconds.get(path, 0.0) + took
        return timed


@dataclass
class NodeCost:
    queues: int
    rows: int
    rounds: int
    frames: int            # PUT frames a round
    cpu_us: float          # process CPU per message
    put_us: float          # Node.on_frame of the PUT frames, per message
    confirm_us: float      # Node.on_frame of the CONFIRM frames, per message
    ranges: float          # CONFIRM ranges per frame
    round_ms: float = 0.0  # wall time of a round: its PUT frames to their ACKs, PUSHes and the CONFIRM
    commit_ms: float = 0.0  # a PUT group commit's wall time (the committer's own histogram): append, ACKs, PUSHes
    phases_us: dict[str, float] = field(default_factory=dict)   # thread CPU per message by phase (`PHASES`)

    def line(self) -> str:
        frames = f" x {self.frames} frames" if self.frames > 1 else ""
        head = (f"{self.queues:>6,} queues, {self.rows} rows a frame{frames}: {self.cpu_us:6.1f} us of CPU a message; "
                f"on_frame PUT {self.put_us:.2f} us, CONFIRM {self.confirm_us:.2f} us a message "
                f"({self.ranges:.0f} ranges a CONFIRM frame); {self.round_ms:.2f} ms a round, "
                f"{self.commit_ms:.2f} ms a PUT commit")
        order = {label: n for n, (label, *_) in enumerate(PHASES)}

        def key(path: str) -> list[int]:
            return [order.get(label, len(order)) for label in path.split(" > ")]
        lines = [f"    {'  ' * path.count(' > ')}{path.rsplit(' > ', 1)[-1]:<{24 - 2 * path.count(' > ')}} "
                 f"{us:6.2f} us a message" for path, us in sorted(self.phases_us.items(), key=lambda i: key(i[0]))]
        return "\n".join([head, *lines])


def measure(queues: int, rows: int, rounds: int, size: int = 1024, frames: int = 1) -> NodeCost:
    from conf import ClusterConfig, HaConfig, NodeConfig, parse_domain
    from primary.node import Node
    from protocol import columns, gc_tuning, malloc_tuning, pb
    from protocol.stream import Link

    with tempfile.TemporaryDirectory(prefix="taproot-node-cost-") as scratch, PhaseClock() as clock:
        config = ClusterConfig(data_dir=scratch, partitions=1, nodes=(NodeConfig("node1", port=1),),
                               ha=HaConfig(lease_duration_ms=4000, lease_renew_interval_ms=500),
                               domains={"d": parse_domain("d", {})})
        node = Node(config, "node1")
        node.start("127.0.0.1:1")
        try:
            deadline = time.monotonic() + 30
            while 0 not in node.partitions:
                if time.monotonic() > deadline:
                    raise RuntimeError("the node did not take partition 0 within 30 s")
                time.sleep(0.05)
            link = Link("bench")
            node.open_link(link)

            def take() -> pb.Frame:
                try:
                    return link.next_frame(FRAME_WAIT_S)
                except queue.Empty:
                    raise RuntimeError(f"the node sent nothing for {FRAME_WAIT_S} s") from None

            def next_frame(kind: str) -> pb.Frame:
                while True:
                    frame = take()
                    if frame.WhichOneof("body") == kind:
                        return frame

            for qid in range(1, queues + 1):
                node.on_frame(link, pb.Frame(open_queue=pb.OpenQueue(
                    request_id=qid, queue_id=qid, uri=f"taproot://d/q{qid}", write=True, read=True,
                    columnar_push=True, push_group=1)))
                next_frame("open_queue_response")
            payload = b"x" * size
            guid = 0

            def put_frame(first: int) -> pb.Frame:
                nonlocal guid
                qids = [1 + (first + i) % queues for i in range(rows)]
                messages = [pb.PutMessage(queue_id=q, guid=(guid + i).to_bytes(16, "big"), payload=payload)
                            for i, q in enumerate(qids)]
                guid += rows
                return pb.Frame(put_columns=pb.PutColumns(
                    arrow_ipc=columns.encode_puts(messages), per_message=True,
                    guids=b"".join(m.guid for m in messages), queue_ids=qids))

            def one_round(first: int) -> tuple[float, float, int]:
                puts = [put_frame(first + f * rows) for f in range(frames)]
                started = time.perf_counter()
                for put in puts:
                    node.on_frame(link, put)
                put_s = time.perf_counter() - started
                acked, pushed = 0, 0
                ids: list[int] = []
                starts: list[int] = []
                counts: list[int] = []
                while acked < frames or pushed < frames * rows:
                    frame = take()
                    kind = frame.WhichOneof("body")
                    if kind == "ack_columns":
                        acked += 1
                    elif kind == "push_columns":
                        push = frame.push_columns
                        pushed += sum(push.seq_counts)
                        ids.extend(push.range_queue_ids or [push.queue_id] * len(push.seq_starts))
                        starts.extend(push.seq_starts)
                        counts.extend(push.seq_counts)
                    elif kind == "push":   # fewer than a columnar frame's minimum go as messages
                        for message in frame.push.messages:
                            pushed += 1
                            ids.append(message.queue_id)
                            starts.append(message.sequence)
                            counts.append(1)
                confirm = pb.Frame(confirm_columns=pb.ConfirmColumns(queue_ids=ids, starts=starts, counts=counts))
                started = time.perf_counter()
                node.on_frame(link, confirm)
                return put_s, time.perf_counter() - started, len(ids)

            gc_tuning.settle_for_serving()   # as a serving node does
            malloc_tuning.tune()   # and its allocator
            partition = node.partitions[0]

            def confirms_committed() -> None:
                while not partition.confirm_committer.idle:
                    time.sleep(0.005)

            for n in range(WARM_UP_ROUNDS):
                one_round(n * rows * frames)
            confirms_committed()   # the warm-up's, outside the phases
            clock.reset()
            committer = partition.put_committer
            cpu0, wall0 = time.process_time(), time.perf_counter()
            commits0, commit_s0 = committer.seconds.count, committer.seconds.sum
            put_s = confirm_s = 0.0
            ranges = 0
            for n in range(rounds):
                p, c, r = one_round((WARM_UP_ROUNDS + n) * rows * frames)
                put_s, confirm_s, ranges = put_s + p, confirm_s + c, ranges + r
            wall = time.perf_counter() - wall0
            commits, commit_s = committer.seconds.count - commits0, committer.seconds.sum - commit_s0
            confirms_committed()
            cpu = time.process_time() - cpu0
            phases = dict(clock.seconds)
        finally:
            node.stop(graceful=False)
    messages = rounds * rows * frames
    return NodeCost(queues, rows, rounds, frames, cpu * 1e6 / messages, put_s * 1e6 / messages,
                    confirm_s * 1e6 / messages, ranges / rounds, wall * 1e3 / rounds,
                    commit_s * 1e3 / max(1, commits), {path: s * 1e6 / messages for path, s in phases.items()})


def main(argv: list[str] | None = None) -> int:
    from taproot_ops.bench import queue_sweep

    return queue_sweep.main(
        "node_cost", __doc__ or "", measure, lambda cost: cast(NodeCost, cost).cpu_us, argv,
        queues=[1, 2000], rows=500, rows_help="rows a PUT frame", rounds=100,
        rounds_help="rounds measured, after 5 of warm-up", unit="CPU a message", announce=True,
        frames_help="PUT frames a round (one group commit takes them)")


if __name__ == "__main__":
    raise SystemExit(main())
