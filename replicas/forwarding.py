"""The replica's forwarding: a node relaying the queues of partitions it does
not lead to their primary.

One `Upstream` (the relay every hop runs, with its retransmission buffer) per
such partition, shared by every link below; the upstream follows the
partition's primary as leases move (`leaders(p)` says where it is). A frame
from below may mix queues this node serves and queues it relays: `split`
forwards the relayed part and hands back the rest.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

from protocol import pb, seqs
from protocol.retransmit import RetransmissionLimits
from protocol.stream import Link
from protocol.tls import ClientTls
from replicas.upstream import Upstream

# Frames that name one of a link's queues (the rest concern the link itself).
QUEUE_FRAMES = frozenset({"put", "put_columns", "confirm", "confirm_columns", "configure_queue", "close_queue",
                          "stop_request"})


class Forwarding:
    def __init__(self, leaders: Callable[[int], list[str]], name: str, limits: RetransmissionLimits,
                 tls: ClientTls | None = None, token: str | None = None):
        self._leaders = leaders
        self._tls = tls
        self._token = token
        self._name = name
        self._limits = limits
        self._lock = threading.Lock()
        self._upstreams: dict[int, Upstream] = {}               # partition -> its upstream
        self._relayed: dict[Link, dict[int, Upstream]] = {}     # link -> queue id -> upstream

    def _upstream(self, partition: int) -> Upstream:
        with self._lock:
            upstream = self._upstreams.get(partition)
            if upstream is None:
                upstream = self._upstreams[partition] = Upstream(
                    functools.partial(self._leaders, partition), name=f"{self._name}-p{partition}",
                    limits=self._limits, tls=self._tls, token=self._token)
                upstream.start()
            return upstream

    def buffered(self) -> tuple[int, int]:
        """PUTs relayed to other nodes' partitions not ACKed yet: (messages, bytes)."""
        with self._lock:
            upstreams = list(self._upstreams.values())
        held = [u.buffered() for u in upstreams]
        return sum(m for m, _ in held), sum(b for _, b in held)

    def relays(self, link: Link, queue_id: int) -> bool:
        return queue_id in self._relayed.get(link, {})

    @property
    def links(self) -> set[Link]:
        with self._lock:
            return set(self._relayed)

    def open(self, link: Link, req: pb.OpenQueue, partition: int) -> None:
        """Relay this open (and from now on this queue's frames) to the partition's primary."""
        upstream = self._upstream(partition)
        with self._lock:
            self._relayed.setdefault(link, {})[req.queue_id] = upstream
        upstream.on_frame(link, pb.Frame(open_queue=req))

    def split(self, link: Link, frame: pb.Frame) -> pb.Frame | None:
        """Forward the part of `frame` that concerns relayed queues; return
        what is left for this node (None: nothing)."""
        relayed = self._relayed.get(link)
        kind = frame.WhichOneof("body")
        if not relayed or kind not in QUEUE_FRAMES:
            return frame
        if kind in ("put", "confirm"):
            batch = getattr(frame, kind)
            if not any(m.queue_id in relayed for m in batch.messages):
                return frame
            by_upstream: dict[Upstream, list[Any]] = {}
            local = []
            for message in batch.messages:
                upstream = relayed.get(message.queue_id)
                if upstream is None:
                    local.append(message)
                else:
                    by_upstream.setdefault(upstream, []).append(message)
            frame_type = pb.PutBatch if kind == "put" else pb.ConfirmBatch
            for upstream, messages in by_upstream.items():
                upstream.on_frame(link, pb.Frame(**{kind: frame_type(messages=messages)}))
            return pb.Frame(**{kind: frame_type(messages=local)}) if local else None
        if kind == "confirm_columns" and frame.confirm_columns.queue_ids:
            return self._split_confirm_columns(link, relayed, frame)
        if kind == "put_columns" and frame.put_columns.queue_ids:
            # A PUT frame of several queues is never split: it goes whole to
            # the primary of its queues' partition. One whose queues this node
            # serves, or of two partitions, stays (the node answers it).
            upstreams = {relayed.get(q) for q in set(frame.put_columns.queue_ids)}
            if len(upstreams) == 1 and None not in upstreams:
                next(iter(upstreams)).on_frame(link, frame)   # type: ignore[union-attr]
                return None
            return frame
        if kind == "stop_request":
            for upstream in set(relayed.values()):
                upstream.on_frame(link, frame)
            return frame  # the node's own queues on this link pause too
        body = getattr(frame, kind)
        with self._lock:
            upstream = relayed.pop(body.queue_id, None) if kind == "close_queue" else relayed.get(body.queue_id)
        if upstream is None:
            return frame
        upstream.on_frame(link, frame)
        return None

    @staticmethod
    def _split_confirm_columns(link: Link, relayed: dict[int, Upstream], frame: pb.Frame) -> pb.Frame | None:
        """A CONFIRM frame of several queues: each relayed queue's ranges go
        to its partition's primary (one frame per upstream), the rest stay.
        The SDK's frames name the queues of a session, which may be led by
        different primaries. A malformed frame stays whole: the node answers it."""
        body = frame.confirm_columns
        if seqs.confirm_columns_invalid(body) or not any(q in relayed for q in body.queue_ids):
            return frame
        parts: dict[Upstream | None, pb.ConfirmColumns] = {}
        for queue_id, start, count in zip(body.queue_ids, body.starts, body.counts):
            part = parts.get(upstream := relayed.get(queue_id))
            if part is None:
                part = parts[upstream] = pb.ConfirmColumns()
            part.queue_ids.append(queue_id)
            part.starts.append(start)
            part.counts.append(count)
        local = parts.pop(None, None)
        for upstream, part in parts.items():
            assert upstream is not None
            upstream.on_frame(link, pb.Frame(confirm_columns=part))
        return pb.Frame(confirm_columns=local) if local else None

    def close_link(self, link: Link) -> None:
        with self._lock:
            relayed = self._relayed.pop(link, {})
        for upstream in set(relayed.values()):
            upstream.close_link(link)

    def pause_consumers(self) -> None:
        """Consumers below relayed queues get nothing new (a graceful stop)."""
        for upstream in self._all():
            upstream.pause_consumers()

    @property
    def drained(self) -> bool:
        return all(upstream.relay.drained for upstream in self._all())

    def stop(self, flush_s: float = 0.0) -> None:
        """`flush_s`: each upstream stream ends the orderly way (`Upstream.stop`),
        all of them at once, within `flush_s` in all."""
        upstreams = self._all()
        deadline = time.monotonic() + flush_s
        if flush_s > 0:
            for upstream in upstreams:
                upstream.end_stream()
        for upstream in upstreams:
            upstream.stop(max(0.01, deadline - time.monotonic()) if flush_s > 0 else 0.0)

    def _all(self) -> list[Upstream]:
        with self._lock:
            return list(self._upstreams.values())
