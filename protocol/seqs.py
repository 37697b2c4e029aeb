"""Seqs as ranges: how CONFIRMs (`ConfirmColumns`) and PUSH frame headers
(`PushColumns.seq_starts` / `seq_counts`) name messages.

A queue's messages are numbered by their partition's seq, in PUT order, so a
consumer's messages mostly come as runs of consecutive seqs: one frame of a
thousand PUSHes is one range, and so is its CONFIRM.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from protocol import taproot_pb2 as pb
from protocol.limits import CONFIRM_FRAME_MESSAGES_MAX

__all__ = ["confirm_columns", "confirm_columns_invalid", "confirm_seqs", "expand", "ranges"]

# Below this many seqs a Python loop beats numpy's set-up.
_NUMPY_MIN = 64


def ranges(seqs: Sequence[int] | np.ndarray) -> tuple[list[int], list[int]]:
    """Runs of consecutive seqs, in the given order: (starts, counts). Order
    is kept (no sort): a frame's seqs are named as it holds them."""
    n = len(seqs)
    if n == 0:
        return [], []
    if n < _NUMPY_MIN and not isinstance(seqs, np.ndarray):
        it = iter(seqs)
        last = next(it)
        starts, counts = [last], [1]
        for s in it:
            if s == last + 1:
                counts[-1] += 1
            else:
                starts.append(s)
                counts.append(1)
            last = s
        return starts, counts
    a = np.asarray(seqs, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(a) != 1) + 1
    firsts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((firsts, [n])))
    return a[firsts].tolist(), lengths.tolist()


def expand(starts: Iterable[int], counts: Iterable[int]) -> list[int]:
    """Every seq the ranges name, in order."""
    out: list[int] = []
    for start, n in zip(starts, counts):
        out.extend(range(start, start + n))
    return out


def confirm_columns_invalid(frame: Any) -> str | None:
    """Why a ConfirmColumns frame is malformed, or None: what a relay and a
    node both check before they act on it."""
    if len(frame.starts) != len(frame.counts):
        return f"ConfirmColumns: {len(frame.starts)} starts but {len(frame.counts)} counts"
    if frame.queue_ids and len(frame.queue_ids) != len(frame.starts):
        return f"ConfirmColumns: {len(frame.starts)} ranges but {len(frame.queue_ids)} queue ids"
    total = sum(frame.counts)
    if total > CONFIRM_FRAME_MESSAGES_MAX:
        return f"ConfirmColumns names {total} messages; at most {CONFIRM_FRAME_MESSAGES_MAX} per frame"
    return None


def confirm_seqs(frame: Any) -> dict[int, list[int]]:
    """A valid ConfirmColumns frame's seqs by queue id ({queue id: seqs}),
    each queue's in the frame's order."""
    if not frame.queue_ids:
        return {frame.queue_id: expand(frame.starts, frame.counts)}
    out: dict[int, list[int]] = {}
    for queue_id, start, count in zip(frame.queue_ids, frame.starts, frame.counts):
        seqs = out.get(queue_id)
        if seqs is None:
            out[queue_id] = [start] if count == 1 else list(range(start, start + count))
        else:
            seqs.extend(range(start, start + count))
    return out


def confirm_columns(by_queue: Mapping[int, tuple[Sequence[int], Sequence[int]]]) -> pb.ConfirmColumns:
    """The ConfirmColumns body of these ranges ({queue id: (starts,
    counts)}): one queue named once, in `queue_id`; several, each range's in
    `queue_ids`. What the SDK, relays and forwarding send."""
    if len(by_queue) == 1:
        ((queue_id, (starts, counts)),) = by_queue.items()
        return pb.ConfirmColumns(queue_id=queue_id, starts=starts, counts=counts)
    body = pb.ConfirmColumns()
    for queue_id, (starts, counts) in by_queue.items():
        body.starts.extend(starts)
        body.counts.extend(counts)
        body.queue_ids.extend([queue_id] * len(starts))
    return body
