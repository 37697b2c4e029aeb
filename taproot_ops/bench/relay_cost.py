"""What a relay's own Python spends per message when a session's frames span
many queues: one `Relay` in this process (no sockets, no gRPC, no threads),
a producer link and a consumer link that open Q queues each, then, per
round, the four frames a proxy handles for R 1 KiB rows: the PUT frame from
below (its rows spread over the queues, a row per queue when R <= Q, as a
session of thousands of queues sends them), its ACK from above, the PUSH
frame of the same rows from above (a range per queue) and their CONFIRM
frame from below. Each is parsed from bytes, handled, and what the relay
sends is serialized, as the proxy does.

    .venv/bin/python -m taproot_ops.bench.relay_cost [--queues 1 10000] [--rows 110] [--rounds 400]

Prints, per queue count, the microseconds of CPU (this thread's) a message
of each frame's handling. It isolates the relay's per-range Python from
gRPC, the event loop and the threads around it (`replicas/upstream.py`, `proxies/server.py`),
which `taproot bench` measures with the rest.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, cast

KINDS = ("put", "ack", "push", "confirm")


@dataclass
class RelayCost:
    queues: int
    rows: int
    rounds: int
    us: dict[str, float]     # per message, by frame kind

    @property
    def total_us(self) -> float:
        return sum(self.us.values())

    def line(self) -> str:
        parts = ", ".join(f"{kind} {self.us[kind]:.2f}" for kind in KINDS)
        return (f"{self.queues:>6,} queues, {self.rows} rows a frame: {self.total_us:5.2f} us a message "
                f"({parts})")


def measure(queues: int, rows: int, rounds: int, size: int = 1024) -> RelayCost:
    from protocol import pb
    from replicas.relay import UPSTREAM, Out, Relay

    relay = Relay(connected=True)
    producer, consumer = "producer", "consumer"
    up_write: dict[int, int] = {}   # down queue id -> up queue id, each link's
    up_read: dict[int, int] = {}

    def answer_opens(out: Out, ids: dict[int, int], qid: int) -> None:
        for destination, frame in out:
            if destination == UPSTREAM and frame is not None and frame.WhichOneof("body") == "open_queue":
                request = frame.open_queue
                ids[qid] = request.queue_id
                relay.from_upstream(pb.Frame(open_queue_response=pb.OpenQueueResponse(
                    request_id=request.request_id, queue_id=request.queue_id, status=pb.Status(code=pb.SUCCESS))))

    for qid in range(1, queues + 1):
        answer_opens(relay.from_downstream(producer, pb.Frame(open_queue=pb.OpenQueue(
            request_id=qid, queue_id=qid, uri=f"taproot://d/q{qid}", write=True))), up_write, qid)
        answer_opens(relay.from_downstream(consumer, pb.Frame(open_queue=pb.OpenQueue(
            request_id=qid, queue_id=qid, uri=f"taproot://d/q{qid}", read=True, columnar_push=True))), up_read, qid)
    if len(up_write) != queues or len(up_read) != queues:
        raise RuntimeError("the relay did not open every queue")
    body = os.urandom(rows * (size + 64))   # the relay never opens a body: bytes of a frame's size will do
    seconds = dict.fromkeys(KINDS, 0.0)

    def timed(kind: str, handle: Callable[[pb.Frame], Out], frame: pb.Frame) -> Out:
        data = frame.SerializeToString()
        started = time.thread_time()   # CPU, not wall: other processes may share the cores
        out = handle(pb.Frame.FromString(data))
        for _, sent in out:
            if sent is not None:
                sent.SerializeToString()
        seconds[kind] += time.thread_time() - started
        return out

    seq = 1
    spanning = queues > 1
    for n in range(rounds):
        qids = [1 + (n * rows + i) % queues for i in range(rows)]
        guids = os.urandom(16 * rows)
        put = pb.PutColumns(arrow_ipc=body, guids=guids, per_message=True)
        if spanning:
            put.queue_ids.extend(qids)
        else:
            put.queue_id = 1
        if not timed("put", lambda f: relay.from_downstream(producer, f, 0.0), pb.Frame(put_columns=put)):
            raise RuntimeError("the relay did not send the PUT frame up")
        timed("ack", lambda f: relay.from_upstream(f, 0.0), pb.Frame(ack_columns=pb.AckColumns(
            queue_id=0 if spanning else up_write[1], guids=guids)))
        push = pb.PushColumns(count=rows, arrow_ipc=body)
        confirm = pb.ConfirmColumns()
        if spanning:
            push.queue_id = up_read[qids[0]]
            push.range_queue_ids.extend(up_read[q] for q in qids)
            push.seq_starts.extend(range(seq, seq + rows))
            push.seq_counts.extend([1] * rows)
            confirm.queue_ids.extend(qids)
            confirm.starts.extend(range(seq, seq + rows))
            confirm.counts.extend([1] * rows)
        else:
            push.queue_id = up_read[1]
            push.seq_starts.append(seq)
            push.seq_counts.append(rows)
            confirm.queue_id = 1
            confirm.starts.append(seq)
            confirm.counts.append(rows)
        timed("push", lambda f: relay.from_upstream(f, 0.0), pb.Frame(push_columns=push))
        timed("confirm", lambda f: relay.from_downstream(consumer, f, 0.0), pb.Frame(confirm_columns=confirm))
        seq += rows
    if relay.unacked_count or relay.unconfirmed_count:
        raise RuntimeError(f"the relay still holds {relay.unacked_count} PUTs and "
                           f"{relay.unconfirmed_count} unconfirmed messages")
    messages = rows * rounds
    return RelayCost(queues, rows, rounds, {kind: s * 1e6 / messages for kind, s in seconds.items()})


def main(argv: list[str] | None = None) -> int:
    from taproot_ops.bench import queue_sweep

    return queue_sweep.main(
        "relay_cost", __doc__ or "", measure, lambda cost: cast(RelayCost, cost).total_us, argv,
        queues=[1, 10_000], rows=110, rows_help="rows a frame (110: a PUT frame's rows in `taproot bench "
        "--scenario queues-10000`)", rounds=400, rounds_help="rounds of four frames measured", unit="a message")


if __name__ == "__main__":
    raise SystemExit(main())
