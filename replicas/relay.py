"""Relay: what every forwarding hop does (proxies, and nodes that forward to a
partition's primary).

Many downstream sessions share one upstream session. The relay gives each
downstream (link, queue id) its own upstream queue id and each downstream
request its own upstream request id, and rewrites frames both ways.

**Retransmission buffer.** Every PUT sent up stays in the buffer until its ACK
comes back. When the upstream is lost the relay keeps its routes and buffer;
PUTs that arrive meanwhile join the buffer. When an upstream is connected again
(the same node or another one: `upstream_restored`), the relay reopens every
queue with its current options, then resends the buffered PUTs in their
original order. The partition's pipeline drops the duplicates by GUID within
the domain's history window, and the relay forwards only the first ACK of a
GUID, so a producer sees exactly one ACK per PUT.

The buffer is `protocol.retransmit`'s, the one the SDK keeps too, bounded by
count, bytes and time (`RetransmissionLimits`). A PUT
beyond the count or bytes bound is refused at once (LIMIT_MESSAGES /
LIMIT_BYTES); one that waited longer than the time bound (which must not
exceed the dedup history window) is answered TIMEOUT by `expire`. Never silence.

**StopRequest.** When the upstream sends StopRequest (its node is stopping),
the relay answers StopResponse and from then on keeps PUTs in the buffer
instead of sending them; ACKs, PUSHes and CONFIRMs keep flowing until the
upstream goes, and the buffer goes to the next upstream. A StopRequest from a
downstream client pauses PUSHes to its consumers.

While disconnected: opens and configures wait for the next upstream; closes
complete at once; CONFIRMs are dropped (the message is delivered again, as
BlazingMQ does).

Pure: frames in, `(destination, frame)` pairs out; `UPSTREAM` or a downstream
link is the destination, and a `None` frame means "close that downstream link"
(used when a queue cannot be reopened). Time comes in as `now_ms`. Not thread
safe: the owner serialises calls.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, cast

import pyarrow as pa

from protocol import ResultCode, columns, pb, status, wire
from protocol.frames import frame_of
from protocol.limits import GUID_LENGTH, PUT_FRAME_MESSAGES_MAX
from protocol.retransmit import RetransmissionBuffer, RetransmissionLimits, put_frames
from protocol.seqs import confirm_columns_invalid

__all__ = ["UPSTREAM", "Out", "Relay", "RetransmissionLimits"]

UPSTREAM = "upstream"
Out = list[tuple[Any, "pb.Frame | None"]]  # (UPSTREAM or a downstream link, frame)
log = logging.getLogger(__name__)


def push_group(link: Hashable, group: int) -> int:
    """The push group a relay names upstream for a consumer's queue: one
    number per session below it (`link`) and group that session named (a
    relay below this one). A number from the pair's hash, not a table: a
    relay keeps nothing per session for it. Two pairs that share a number
    only cost a split frame (`Relay._split_push_span`), never a wrong one."""
    return hash((link, group)) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class _Route:
    link: Hashable
    queue_id: int                   # the downstream queue id
    read: bool
    open_request: pb.OpenQueue      # as sent up (upstream ids), options kept current
    open: bool = False              # the upstream answered SUCCESS on this connection
    unconfirmed: set[int] = field(default_factory=set)     # seqs pushed down and not confirmed yet
    broadcast: bool = False         # the upstream said so at open: nothing to confirm
    timeout_ms: float = 0.0         # retransmission time bound (min of the limit and the dedup window)


@dataclass
class _Request:
    link: Hashable | None           # None: the relay's own reopen
    request_id: int                 # the downstream request id
    kind: str
    upstream_queue_id: int


@dataclass
class _Buffered:
    frame: pb.PutMessage | pb.PutColumns
    link: Hashable
    queue_id: int                   # downstream queue id, for answers from the relay itself
    # PUTs of this GUID (or columnar frames of these GUIDs) sent again on the
    # same stream before the first ACK: the primary answers each (the later
    # ones as duplicates), so each gets its own ACK down and is resent.
    copies: int = 1
    up_qids: list[int] | None = None   # a PUT frame spanning queues: its upstream queues (it waits for all)

    def group(self, key: tuple[int, bytes]) -> int | list[int]:
        """What it waits for after a reconnect: its queue's reopen, or all of theirs."""
        return self.up_qids if self.up_qids is not None else key[0]


_UNSEEN: Any = object()   # a dict lookup's "not there yet" (None is a value)
SPANNING = 0   # the queue id in the buffer key (and the ACK) of a PUT frame spanning queues


class Relay:
    def __init__(self, limits: RetransmissionLimits | None = None, connected: bool = True):
        self.limits = limits or RetransmissionLimits()
        self._queue_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._up: dict[tuple[Hashable, int], int] = {}     # (link, down qid) -> up qid
        self._routes: dict[int, _Route] = {}               # up qid -> route
        self._requests: dict[int, _Request] = {}           # up request id -> request
        # (up qid, guid or the columnar frame's GUIDs) -> what to resend, in PUT order
        self._buffer: RetransmissionBuffer[tuple[int, bytes], _Buffered] = RetransmissionBuffer(self.limits)
        self.connected = connected
        self.stopping = False            # the upstream sent StopRequest: hold PUTs
        self.now_ms = 0.0

    @property
    def unacked_count(self) -> int:
        return self._buffer.messages

    @property
    def unacked_bytes(self) -> int:
        return self._buffer.nbytes

    @property
    def unconfirmed_count(self) -> int:
        """Messages pushed down through this relay and not confirmed yet (what
        a graceful stop waits for)."""
        return sum(len(r.unconfirmed) for r in self._routes.values())

    @property
    def route_count(self) -> int:
        return len(self._routes)

    @property
    def sending(self) -> bool:
        return self.connected and not self.stopping

    # -- downstream -> upstream ---------------------------------------------
    def from_downstream(self, link: Hashable, frame: pb.Frame, now_ms: float | None = None) -> Out:
        if now_ms is not None:
            self.now_ms = now_ms
        kind = frame.WhichOneof("body")
        if kind == "put":
            return self._put(link, frame)
        if kind == "confirm":
            return self._confirm(link, frame.confirm)
        if kind == "confirm_columns":
            return self._confirm_columns(link, frame)
        if kind == "put_columns":
            return self._put_columns(link, frame.put_columns)
        if kind == "open_queue":
            return self._open(link, frame.open_queue)
        if kind in ("configure_queue", "close_queue"):
            return self._queue_request(link, kind, getattr(frame, kind))
        if kind == "heartbeat":
            return [(link, frame)]
        if kind == "stop_request":
            return self._stop(link, frame.stop_request)
        if kind == "stop_response":
            return []  # a client acknowledging our StopRequest
        reason = "empty frame" if kind is None else f"a {kind} frame is not valid from a client"
        return [(link, pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, reason))))]

    def _open(self, link: Hashable, req: pb.OpenQueue) -> Out:
        if (link, req.queue_id) in self._up:
            return [(link, pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(
                    ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is already open on this session"))))]
        up_qid = next(self._queue_ids)
        up_req = next(self._request_ids)
        up = pb.OpenQueue()
        up.CopyFrom(req)
        up.queue_id, up.request_id = up_qid, up_req
        if req.read:
            up.push_group = push_group(link, req.push_group)
        self._up[(link, req.queue_id)] = up_qid
        self._routes[up_qid] = _Route(link, req.queue_id, req.read, up, timeout_ms=self.limits.timeout_ms)
        self._requests[up_req] = _Request(link, req.request_id, "open_queue", up_qid)
        # While disconnected the open waits: `upstream_restored` sends it.
        return [(UPSTREAM, pb.Frame(open_queue=up))] if self.connected else []

    def _queue_request(self, link: Hashable, kind: str, req: Any) -> Out:
        up_qid = self._up.get((link, req.queue_id))
        if up_qid is None:
            return [(link, _response(kind, req, ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open"))]
        route = self._routes[up_qid]
        if kind == "configure_queue":
            route.open_request.options.CopyFrom(req.options)  # a reopen uses the latest options
        if not self.connected:
            if kind == "close_queue":
                self._forget_route(up_qid)
            # Configure: the reopen carries the new options. Close: nothing upstream to close.
            return [(link, _response(kind, req, ResultCode.SUCCESS))]
        up_req = next(self._request_ids)
        self._requests[up_req] = _Request(link, req.request_id, kind, up_qid)
        frame = pb.Frame()
        body = getattr(frame, kind)
        body.CopyFrom(req)
        body.queue_id, body.request_id = up_qid, up_req
        return [(UPSTREAM, frame)]

    def _hold(self, up_qid: int, key: bytes, entry: _Buffered, nbytes: int, count: int) -> None:
        self._buffer.hold((up_qid, key), entry, nbytes, count, self.now_ms, self._routes[up_qid].timeout_ms)

    def _may_send(self, up_qid: int) -> bool:
        """A new PUT of this queue goes up now: the upstream takes PUTs, the
        queue is open there and none of its PUTs waits (behind a frame
        spanning queues that waits for another queue's reopen)."""
        return self.sending and self._routes[up_qid].open and not self._buffer.blocked(up_qid)

    def _release(self, key: tuple[int, bytes]) -> _Buffered | None:
        """The entry an ACK from upstream answers (one of its copies)."""
        held = self._buffer.peek(key)
        if held is None:
            return None
        if held.item.copies > 1:
            held.item.copies -= 1
        else:
            self._buffer.release(key)
        return held.item

    def _again(self, link: Hashable, down_qid: int, key: tuple[int, bytes]) -> bool:
        """Whether this stream sent `key` for this queue and it awaits its
        ACK: then this PUT is one more copy of that entry (counted here)."""
        held = self._buffer.peek(key)
        if held is None or held.item.link != link or held.item.queue_id != down_qid:
            return False  # new, or a resend on a new stream (which replaces the old entry)
        held.item.copies += 1
        return True

    def _put(self, link: Hashable, frame: pb.Frame) -> Out:
        out_messages, nacks = [], []
        batch = frame.put
        for message in batch.messages:
            up_qid = self._up.get((link, message.queue_id))
            refused = ((ResultCode.INVALID_ARGUMENT, f"queue id {message.queue_id} is not open")
                       if up_qid is None else self._buffer.refusal(len(message.payload)))
            if refused is not None:
                nacks.append(pb.AckMessage(queue_id=message.queue_id, guid=message.guid, code=wire(refused[0]),
                                           message=refused[1]))
                continue
            assert up_qid is not None
            down_qid = message.queue_id
            message.queue_id = up_qid
            sending = self._may_send(up_qid)
            if not self._again(link, down_qid, (up_qid, message.guid)):
                self._hold(up_qid, message.guid, _Buffered(message, link, down_qid), len(message.payload), 1)
                if not sending:  # goes when its queue is open upstream (with every copy)
                    self._buffer.defer(up_qid, (up_qid, message.guid))
            if sending:
                out_messages.append(message)
        out: Out = []
        if out_messages:
            # A new frame, not `frame` itself: the buffer keeps these messages
            # for retransmission, and the frame upstream must not share them.
            out.append((UPSTREAM, pb.Frame(put=pb.PutBatch(messages=out_messages))))
        if nacks:
            out.append((link, pb.Frame(ack=pb.AckBatch(messages=nacks))))
        return out

    def _put_columns(self, link: Hashable, req: pb.PutColumns) -> Out:
        """A columnar PUT frame goes up as it came, its queue id rewritten.
        Its header names its GUIDs (`PutColumns.guids`): the body is not
        opened here (a frame without the header is read for them)."""
        guids = frame_guids(req)
        if isinstance(guids, str):  # no GUID is known: a frame error is all that can be said
            return [(link, pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, guids))))]
        count = len(guids) // GUID_LENGTH
        body = req.arrow_ipc   # (a copy of the bytes, made once)
        nbytes = len(body)
        if req.queue_ids:
            return self._put_spanning(link, req, body, guids, count)
        up_qid = self._up.get((link, req.queue_id))
        refused = ((ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open") if up_qid is None
                   else self._buffer.refusal(nbytes, count))
        if refused is not None:
            return [(link, pb.Frame(ack_columns=pb.AckColumns(queue_id=req.queue_id, guids=guids,
                                                              code=wire(refused[0]), message=refused[1])))]
        assert up_qid is not None
        # A frame of its own (the bytes as they came): the one from below may
        # be held by its sender too (in-process links), and must not change.
        out = frame_of("put_columns", queue_id=up_qid, arrow_ipc=body, per_message=req.per_message,
                               guids=guids)
        up = out.put_columns
        sending = self._may_send(up_qid)
        if not self._again(link, req.queue_id, (up_qid, guids)):
            self._hold(up_qid, guids, _Buffered(up, link, req.queue_id), nbytes, count)
            if not sending:
                self._buffer.defer(up_qid, (up_qid, guids))
        return [(UPSTREAM, out)] if sending else []

    def _put_spanning(self, link: Hashable, req: pb.PutColumns, body: bytes, guids: bytes, count: int) -> Out:
        """A PUT frame spanning queues goes up whole, each row's queue id
        rewritten (from the header: the body is not opened), and is held as
        one entry: it goes once all its queues are open upstream."""
        nbytes = len(body)
        down_ids = req.queue_ids
        ups, routes = self._up, self._routes
        up_of: dict[int, int] = {}
        closed = None
        for q in dict.fromkeys(down_ids):   # each queue once (a session of thousands sends a row or two of each)
            up_qid = ups.get((link, q))
            if up_qid is None:
                closed = q
                break
            up_of[q] = up_qid
        refused = ((ResultCode.INVALID_ARGUMENT, f"queue id {closed} is not open") if closed is not None
                   else self._buffer.refusal(nbytes, count))
        if refused is not None:
            return [(link, pb.Frame(ack_columns=pb.AckColumns(queue_id=req.queue_id, guids=guids,
                                                              code=wire(refused[0]), message=refused[1])))]
        out = frame_of("put_columns", arrow_ipc=body, per_message=req.per_message, guids=guids,
                               queue_ids=[up_of[q] for q in down_ids])
        up = out.put_columns
        up_qids = list(up_of.values())
        # Whether every queue may send, and the shortest time bound, in one pass.
        sending = True
        timeout_ms = float("inf")
        for q in up_qids:
            timeout_ms = min(timeout_ms, routes[q].timeout_ms)
            sending = sending and self._may_send(q)
        key = (SPANNING, guids)
        if not self._again(link, req.queue_id, key):
            self._buffer.hold(key, _Buffered(up, link, req.queue_id, up_qids=up_qids), nbytes, count,
                              self.now_ms, timeout_ms)
            if not sending:
                self._buffer.defer_many(up_qids, key)
        return [(UPSTREAM, out)] if sending else []

    def _confirm(self, link: Hashable, batch: pb.ConfirmBatch) -> Out:
        if not self.connected:
            return []  # not buffered: the primary delivers it again (BlazingMQ does the same)
        messages = []
        for message in batch.messages:
            up_qid = self._up.get((link, message.queue_id))
            if up_qid is not None:
                self._routes[up_qid].unconfirmed.discard(message.sequence)
                messages.append(pb.ConfirmMessage(queue_id=up_qid, guid=message.guid, sequence=message.sequence))
        return [(UPSTREAM, pb.Frame(confirm=pb.ConfirmBatch(messages=messages)))] if messages else []

    def _confirm_columns(self, link: Hashable, frame: pb.Frame) -> Out:
        """Seq ranges: they go up as they came, under the upstream queue ids
        (a frame of several queues stays one frame)."""
        if not self.connected:
            return []
        body = frame.confirm_columns
        invalid = confirm_columns_invalid(body)
        if invalid:
            return [(link, pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, invalid))))]
        if not body.queue_ids:
            up_qid = self._up.get((link, body.queue_id))
            if up_qid is None:
                return []   # not open (any more): nothing of it is held here
            _forget(self._routes[up_qid].unconfirmed, body.starts, body.counts)
            return [(UPSTREAM, pb.Frame(confirm_columns=pb.ConfirmColumns(
                queue_id=up_qid, starts=body.starts, counts=body.counts)))]
        # Ranges of many queues: one pass in the frame's order, each range's
        # queue id rewritten (a session of thousands of queues sends a range
        # or two of each); a range of a queue not open here is left out.
        ups, routes = self._up, self._routes
        held: dict[int, tuple[int, set[int]] | None] = {}
        queue_ids: list[int] = []
        for queue_id, start, count in zip(body.queue_ids, body.starts, body.counts):
            entry = held.get(queue_id, _UNSEEN)
            if entry is _UNSEEN:
                up_qid = ups.get((link, queue_id))
                entry = held[queue_id] = None if up_qid is None else (up_qid, routes[up_qid].unconfirmed)
            if entry is None:
                continue   # not open (any more): nothing of it is held here
            if count == 1:
                entry[1].discard(start)
            else:
                _forget(entry[1], (start,), (count,))
            queue_ids.append(entry[0])
        if not queue_ids:
            return []
        starts: Iterable[int] = body.starts
        counts: Iterable[int] = body.counts
        if len(queue_ids) < len(body.starts):   # some were left out: the ranges of the open queues only
            kept = [(s, c) for q, s, c in zip(body.queue_ids, body.starts, body.counts) if held[q] is not None]
            starts, counts = [s for s, _ in kept], [c for _, c in kept]
        # A frame of its own: the one from below may be its sender's too (in-process links).
        first = queue_ids[0]
        one_queue = queue_ids.count(first) == len(queue_ids)
        return [(UPSTREAM, pb.Frame(confirm_columns=pb.ConfirmColumns(
            queue_id=first if one_queue else 0, queue_ids=[] if one_queue else queue_ids,
            starts=starts, counts=counts)))]

    def _stop(self, link: Hashable, req: pb.StopRequest) -> Out:
        # Stop sending PUSHes to a stopping client: pause its consumers upstream.
        return self.pause_consumers(link) + [
            (link, pb.Frame(stop_response=pb.StopResponse(request_id=req.request_id)))]

    def pause_consumers(self, link: Hashable | None = None) -> Out:
        """Ask the upstream to push nothing more to the consumers of `link`
        (of every link if None): 0/0 flow control. A reopen on another upstream
        uses the consumers' own options again. Each pause is a request of the
        relay's own (`pauses_pending` until answered): its response comes on
        the same stream after every PUSH the upstream sent before applying it,
        so once it is answered, `unconfirmed_count` counts every message in
        flight to those consumers (what a graceful stop must wait for)."""
        if not self.connected:
            return []
        out: Out = []
        for up_qid, route in self._routes.items():
            if route.read and (link is None or route.link == link):
                up_req = next(self._request_ids)
                self._requests[up_req] = _Request(None, 0, "configure_queue", up_qid)
                out.append((UPSTREAM, pb.Frame(configure_queue=pb.ConfigureQueue(
                    request_id=up_req, queue_id=up_qid, options=pb.QueueOptions()))))
        return out

    @property
    def pauses_pending(self) -> int:
        """Pauses sent upstream and not answered yet (`pause_consumers`)."""
        return sum(1 for r in self._requests.values() if r.link is None and r.kind == "configure_queue")

    @property
    def drained(self) -> bool:
        """What a graceful stop waits for: its pauses answered, every PUT sent
        up ACKed and every message pushed down confirmed."""
        return self.pauses_pending == 0 and self.unacked_count == 0 and self.unconfirmed_count == 0

    def downstream_closed(self, link: Hashable) -> Out:
        """Close upstream every queue the departed link had open (the primary
        then redelivers its unconfirmed messages)."""
        out: Out = []
        for (owner, _), up_qid in list(self._up.items()):
            if owner != link:
                continue
            self._forget_route(up_qid)
            if self.connected:
                out.append((UPSTREAM, pb.Frame(close_queue=pb.CloseQueue(request_id=0, queue_id=up_qid))))
        for key in [r for r, req in self._requests.items() if req.link == link]:
            del self._requests[key]
        # Its PUTs already sent stay buffered until their ACK (then dropped);
        # the ones not sent yet have no queue to go to once it is closed.
        for buffered, held in self._buffer.items():
            queues = held.item.up_qids or [buffered[0]]
            if held.item.link == link and any(q not in self._routes for q in queues):
                self._buffer.release(buffered)
        return out

    def _forget_route(self, up_qid: int) -> None:
        route = self._routes.pop(up_qid, None)
        self._buffer.forget_deferred(up_qid)
        if route is not None:
            self._up.pop((route.link, route.queue_id), None)

    # -- upstream -> downstream ---------------------------------------------
    def from_upstream(self, frame: pb.Frame, now_ms: float | None = None) -> Out:
        if now_ms is not None:
            self.now_ms = now_ms
        kind = frame.WhichOneof("body")
        if kind == "ack":
            return self._route_acks(frame)
        if kind == "push":
            return self._route_pushes(frame)
        if kind == "push_columns":
            return self._route_push_columns(frame)
        if kind == "ack_columns":
            ack = frame.ack_columns
            entry = self._release((ack.queue_id, ack.guids))
            if entry is None:
                return []  # a retransmitted frame's second ACK
            ack.queue_id = entry.queue_id
            return [(entry.link, pb.Frame(ack_columns=ack))]
        if kind in ("open_queue_response", "configure_queue_response", "close_queue_response"):
            return self._response(kind, getattr(frame, kind))
        if kind == "stop_request":
            self.stopping = True
            return [(UPSTREAM, pb.Frame(stop_response=pb.StopResponse(request_id=frame.stop_request.request_id)))]
        if kind == "error":
            request = self._requests.pop(frame.error.request_id, None)
            if request is not None and request.link is not None:
                error = pb.FrameError(request_id=request.request_id, status=frame.error.status)
                return [(request.link, pb.Frame(error=error))]
        return []  # heartbeats and stop responses to the relay itself

    def _route_acks(self, frame: pb.Frame) -> Out:
        by_link: dict[Hashable, list[Any]] = {}
        acks = frame.ack.messages
        for ack in acks:
            entry = self._release((ack.queue_id, ack.guid))
            if entry is None:
                continue  # the second ACK of a retransmitted PUT, or one already answered
            ack.queue_id = entry.queue_id
            by_link.setdefault(entry.link, []).append(ack)
        return _regroup(frame, "ack", pb.AckBatch, by_link, len(acks))

    def _route_pushes(self, frame: pb.Frame) -> Out:
        """Route each PUSH to the links below; a message for several queues
        (`queue_ids`) goes down each link once, with that link's queue ids."""
        by_link: dict[Hashable, list[Any]] = {}
        messages = frame.push.messages
        routes = self._routes
        for message in messages:
            if not message.queue_ids:   # one queue (most PUSHes): no per-link grouping to do
                route = routes.get(message.queue_id)
                if route is None:
                    continue  # the downstream link is gone; the primary redelivers PUSHes
                if not route.broadcast:
                    route.unconfirmed.add(message.sequence)
                message.queue_id = route.queue_id
                pushes = by_link.get(route.link)
                if pushes is None:
                    by_link[route.link] = [message]
                else:
                    pushes.append(message)
                continue
            targets = list(message.queue_ids)
            per_link: dict[Hashable, list[int]] = {}
            for up_qid in targets:
                route = self._routes.get(up_qid)
                if route is None:
                    continue  # the downstream link is gone; the primary redelivers PUSHes
                if not route.broadcast:
                    route.unconfirmed.add(message.sequence)
                per_link.setdefault(route.link, []).append(route.queue_id)
            for n, (link, queue_ids) in enumerate(per_link.items()):
                copy = message
                if len(per_link) > 1 and n < len(per_link) - 1:
                    copy = pb.PushMessage()
                    copy.CopyFrom(message)
                del copy.queue_ids[:]
                if len(queue_ids) == 1:
                    copy.queue_id = queue_ids[0]
                else:
                    copy.queue_id = queue_ids[0]
                    copy.queue_ids.extend(queue_ids)
                by_link.setdefault(link, []).append(copy)
        return _regroup(frame, "push", pb.PushBatch, by_link, len(messages))

    def _route_push_columns(self, frame: pb.Frame) -> Out:
        """A columnar PUSH frame goes down as it came, its queue id rewritten;
        only its header is read: the seq ranges, what a graceful stop waits
        to see confirmed. The Arrow body is not opened here."""
        push = frame.push_columns
        if push.range_queue_ids:
            return self._route_push_span(frame)
        per_link: dict[Hashable, list[int]] = {}
        routes = [r for r in (self._routes.get(q) for q in (list(push.queue_ids) or [push.queue_id])) if r is not None]
        if not routes:
            return []  # the downstream link is gone; the primary redelivers
        for route in routes:
            if not route.broadcast:
                for start, count in zip(push.seq_starts, push.seq_counts):
                    route.unconfirmed.update(range(start, start + count))
            per_link.setdefault(route.link, []).append(route.queue_id)
        out: Out = []
        for n, (link, queue_ids) in enumerate(per_link.items()):
            copy = frame
            if n < len(per_link) - 1:   # (a broadcast to consumers below several links) the last one goes as is
                copy = pb.Frame()
                copy.CopyFrom(frame)
            body = copy.push_columns
            body.queue_id = queue_ids[0]
            del body.queue_ids[:]
            if len(queue_ids) > 1:
                body.queue_ids.extend(queue_ids)
            out.append((link, copy))
        return out

    def _route_push_span(self, frame: pb.Frame) -> Out:
        """A PUSH frame spanning queues of one session (`range_queue_ids`)
        goes down as it came, each range's queue id rewritten. A range whose
        queue is gone here goes with id 0 (the consumer skips it; the primary
        redelivers). Ranges of sessions below different links (a primary
        that did not group by push_group) make one frame per link."""
        push = frame.push_columns
        get = self._routes.get
        routes: list[_Route | None] = []
        ids: list[int] = []
        link: Hashable | None = None   # the link of the ranges' sessions, if they share one
        mixed = False
        for up_qid, start, count in zip(push.range_queue_ids, push.seq_starts, push.seq_counts):
            route = get(up_qid)
            routes.append(route)
            if route is None:
                ids.append(0)
                continue
            ids.append(route.queue_id)
            if count == 1:
                route.unconfirmed.add(start)
            else:
                route.unconfirmed.update(range(start, start + count))
            if link is None:
                link = route.link
            elif route.link != link:
                mixed = True
        if link is None:
            return []
        if mixed:
            return self._split_push_span(push, routes)
        del push.range_queue_ids[:]
        push.range_queue_ids.extend(ids)
        push.queue_id = next(i for i in ids if i)
        return [(link, frame)]

    @staticmethod
    def _split_push_span(push: pb.PushColumns, routes: list["_Route | None"]) -> Out:
        """A spanning PUSH frame whose ranges end at sessions below different
        links, as one frame per link (its body opened, sliced and encoded
        again: only for a primary that does not group by push_group)."""
        table = columns.decode_push(push.arrow_ipc)
        if isinstance(table, str):
            log.error("a PUSH frame of %d messages could not be read to split it: %s", push.count, table)
            return []   # unconfirmed: the primary redelivers once these consumers go
        per_link: dict[Hashable, list[tuple[int, int, int, int]]] = {}
        offset = 0
        for route, start, count in zip(routes, push.seq_starts, push.seq_counts):
            if route is not None:
                per_link.setdefault(route.link, []).append((route.queue_id, start, count, offset))
            offset += count
        out: Out = []
        for link, ranges in per_link.items():
            rows = pa.concat_tables([table.slice(at, count) for _, _, count, at in ranges])
            out.append((link, frame_of(
                "push_columns", queue_id=ranges[0][0], count=rows.num_rows,
                range_queue_ids=[q for q, _, _, _ in ranges], seq_starts=[s for _, s, _, _ in ranges],
                seq_counts=[c for _, _, c, _ in ranges], arrow_ipc=columns.encode_push_table(rows))))
        return out

    def _response(self, kind: str, body: Any) -> Out:
        request = self._requests.pop(body.request_id, None)
        if request is None:
            return []
        route = self._routes.get(request.upstream_queue_id)
        if route is None:
            return []
        failed = body.status.code != ResultCode.SUCCESS
        out: Out = []
        if kind == "open_queue_response":
            if failed:
                if request.link is None:
                    # A reopen after failover was refused: the client must start
                    # over, so end its session (it reconnects and reopens itself).
                    out.extend(self._fail_route(request.upstream_queue_id, body.status))
                    return out + [(route.link, None)]
                self._forget_route(request.upstream_queue_id)
            else:
                route.open = True
                route.broadcast = body.broadcast
                window = body.dedup_history_window_ms
                if window > 0:
                    route.timeout_ms = min(self.limits.timeout_ms, window)
                out.extend(self._resend(request.upstream_queue_id))
        elif kind == "close_queue_response":
            self._forget_route(request.upstream_queue_id)
        if request.link is None:
            return out  # the relay's own reopen: the client already has its answer
        body.request_id, body.queue_id = request.request_id, route.queue_id
        frame = pb.Frame()
        getattr(frame, kind).CopyFrom(body)
        return [(request.link, frame)] + out

    def _fail_route(self, up_qid: int, why: pb.Status) -> Out:
        """Answer the buffered PUTs of a route that cannot be reopened, and drop it."""
        out: Out = []
        for key, held in self._buffer.items():
            if key[0] == up_qid or up_qid in (held.item.up_qids or ()):
                self._buffer.release(key)
                out.extend(self._answer(held.item, ResultCode.of(why.code),
                                        f"queue could not be reopened: {why.message}"))
        self._forget_route(up_qid)
        return out

    @staticmethod
    def _answer(entry: _Buffered, code: ResultCode, text: str) -> list[tuple[object, pb.Frame]]:
        """The relay's own answer to a buffered PUT: one ACK per copy."""
        if isinstance(entry.frame, pb.PutColumns):
            guids = frame_guids(entry.frame)
            if isinstance(guids, str):
                guids = b""
            return [(entry.link, pb.Frame(ack_columns=pb.AckColumns(queue_id=entry.queue_id, guids=guids,
                                                                   code=wire(code), message=text)))] * entry.copies
        return [(entry.link, pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(
            queue_id=entry.queue_id, guid=entry.frame.guid, code=wire(code), message=text)] * entry.copies)))]

    def _resend(self, up_qid: int) -> Out:
        """The buffered PUTs of a queue just opened upstream that this
        upstream has not had yet, in PUT order."""
        if not self.sending:
            return []
        held = self._buffer.take_deferred(up_qid, self._route_open)
        return [(UPSTREAM, frame) for frame in put_frames((h.item.frame for h in held for _ in range(h.item.copies)),
                                                          PUT_FRAME_MESSAGES_MAX)]

    def _route_open(self, up_qid: Hashable) -> bool:
        route = self._routes.get(cast(int, up_qid))
        return route is not None and route.open

    # -- the upstream connection ---------------------------------------------
    def upstream_lost(self) -> Out:
        """Keep routes and buffered PUTs for the next upstream. Requests in
        flight are answered by the reopen (opens) or here (the rest)."""
        self.connected = False
        self.stopping = False
        out: Out = []
        for up_req, request in list(self._requests.items()):
            route = self._routes.get(request.upstream_queue_id)
            if request.kind == "open_queue" and route is not None and request.link is not None:
                continue  # answered when the reopen is answered
            del self._requests[up_req]
            if request.link is None or route is None:
                continue
            if request.kind == "close_queue":
                self._forget_route(request.upstream_queue_id)
            # configure: the options are kept in the route and go with the reopen.
            out.append((request.link, _response(request.kind, _Ids(request.request_id, route.queue_id),
                                                ResultCode.SUCCESS)))
        for route in self._routes.values():
            route.open = False
            route.unconfirmed.clear()  # the next primary delivers them again
        return out

    def upstream_restored(self) -> Out:
        """A new upstream session: reopen every queue, then (as each reopen
        succeeds) resend its buffered PUTs in order."""
        self.connected = True
        self.stopping = False
        self._buffer.defer_all(lambda key, held: held.item.group(key))  # each goes with its queue's reopen
        out: Out = []
        pending_opens = {r.upstream_queue_id: up_req for up_req, r in self._requests.items()
                         if r.kind == "open_queue"}
        for up_qid, route in self._routes.items():
            up_req = pending_opens.get(up_qid)
            if up_req is None:  # opened on an earlier upstream: the relay reopens it itself
                up_req = next(self._request_ids)
                self._requests[up_req] = _Request(None, 0, "open_queue", up_qid)
            route.open_request.request_id = up_req
            out.append((UPSTREAM, pb.Frame(open_queue=route.open_request)))
        return out

    def expire(self, now_ms: float) -> Out:
        """Answer TIMEOUT for PUTs buffered longer than their queue's time bound.
        The buffer is in arrival order, so the scan stops at the first PUT too
        young for even the shortest bound."""
        self.now_ms = now_ms
        out: Out = []
        acks: dict[Hashable, list[pb.AckMessage]] = {}
        for _, gone in self._buffer.expire(now_ms):
            for link, frame in self._answer(gone.item, ResultCode.TIMEOUT, "no ACK within the retransmission "
                                            f"time bound ({gone.timeout_ms:.0f} ms)"):
                if frame.WhichOneof("body") == "ack":
                    acks.setdefault(link, []).extend(frame.ack.messages)
                else:
                    out.append((link, frame))
        return [(link, pb.Frame(ack=pb.AckBatch(messages=items))) for link, items in acks.items()] + out


def frame_guids(req: pb.PutColumns) -> bytes | str:
    """A PUT frame's GUIDs: its header, or (a frame without one) read from
    its body; or why they cannot be known."""
    guids = req.guids
    if guids:
        if len(guids) % GUID_LENGTH:
            return f"PutColumns.guids holds {len(guids)} bytes, not a whole number of {GUID_LENGTH}-byte GUIDs"
        return guids
    from protocol import columns  # pyarrow only when a frame has no header
    table = columns.decode(req.arrow_ipc)
    return table if isinstance(table, str) else columns.guids_of(table)


@dataclass
class _Ids:
    request_id: int
    queue_id: int


def _response(kind: str, req: Any, code: ResultCode, text: str = "") -> pb.Frame:
    response = pb.Frame()
    body = getattr(response, f"{kind}_response")
    body.request_id, body.queue_id = req.request_id, req.queue_id
    body.status.CopyFrom(status(code, text))
    return response


def _regroup(frame: pb.Frame, field: str, batch_type: Any, by_link: dict[Hashable, list[Any]], count: int) -> Out:
    """One frame per link. When every message of `frame` (already rewritten
    in place) goes to one link, `frame` itself goes: building a new batch
    copies every message and its payload (5 ms per 1,000 1 KiB messages; a
    third of a proxy's Python time went to it)."""
    if len(by_link) == 1:
        (link, items), = by_link.items()
        if len(items) == count and all(a is b for a, b in zip(items, getattr(frame, field).messages)):
            return [(link, frame)]
    return [(link, pb.Frame(**{field: batch_type(messages=items)})) for link, items in by_link.items()]


def _forget(unconfirmed: set[int], starts: Iterable[int], counts: Iterable[int]) -> None:
    """Drop the seqs of these ranges from a route's unconfirmed set."""
    for start, count in zip(starts, counts):
        if count <= len(unconfirmed):
            unconfirmed.difference_update(range(start, start + count))
        else:   # a wide range over few held: look at those
            unconfirmed.difference_update([s for s in unconfirmed if start <= s < start + count])
