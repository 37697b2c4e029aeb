"""Relay: what every forwarding hop does (proxies now, replicas later).

Many downstream sessions share one upstream session. The relay gives each
downstream (link, queue id) its own upstream queue id and each downstream
request its own upstream request id, rewrites frames both ways, and remembers
the PUTs it sent up until their ACK comes back, so that if the upstream link
is lost every one of them still gets an answer (UNKNOWN: it may have been
persisted) instead of silence.

Pure: frames in, `(destination, frame)` pairs out; `UPSTREAM` or a downstream
link is the destination. Not thread safe: the owner serialises calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Hashable

from protocol import ResultCode, pb, status, wire

UPSTREAM = "upstream"
Out = list[tuple[object, pb.Frame]]


@dataclass
class _Route:
    link: Hashable
    queue_id: int      # the downstream queue id
    read: bool


@dataclass
class _Request:
    link: Hashable
    request_id: int    # the downstream request id
    kind: str
    upstream_queue_id: int


class Relay:
    def __init__(self) -> None:
        self._queue_ids = itertools.count(1)
        self._request_ids = itertools.count(1)
        self._up: dict[tuple[Hashable, int], int] = {}     # (link, down qid) -> up qid
        self._routes: dict[int, _Route] = {}               # up qid -> route
        self._requests: dict[int, _Request] = {}           # up request id -> request
        self._unacked: dict[tuple[int, bytes], None] = {}  # (up qid, guid) of PUTs sent up
        self._unacked_columns: dict[tuple[int, bytes], None] = {}  # (up qid, the frame's GUIDs)
        self.connected = True

    @property
    def unacked_count(self) -> int:
        return len(self._unacked) + sum(len(g) // 16 for _, g in self._unacked_columns)

    # -- downstream -> upstream ---------------------------------------------
    def from_downstream(self, link: Hashable, frame: pb.Frame) -> Out:
        kind = frame.WhichOneof("body")
        if kind == "put":
            return self._put(link, frame.put)
        if kind == "confirm":
            return self._confirm(link, frame.confirm)
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
        reason = "empty frame" if kind is None else f"a {kind} frame is not valid from a client"
        return [(link, pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, reason))))]

    def _open(self, link: Hashable, req: pb.OpenQueue) -> Out:
        def fail(code: ResultCode, message: str) -> Out:
            return [(link, pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(code, message))))]
        if not self.connected:
            return fail(ResultCode.NOT_CONNECTED, "proxy has no upstream connection")
        if (link, req.queue_id) in self._up:
            return fail(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is already open on this session")
        up_qid = next(self._queue_ids)
        up_req = next(self._request_ids)
        self._up[(link, req.queue_id)] = up_qid
        self._routes[up_qid] = _Route(link, req.queue_id, req.read)
        self._requests[up_req] = _Request(link, req.request_id, "open_queue", up_qid)
        up = pb.OpenQueue()
        up.CopyFrom(req)
        up.queue_id, up.request_id = up_qid, up_req
        return [(UPSTREAM, pb.Frame(open_queue=up))]

    def _queue_request(self, link: Hashable, kind: str, req) -> Out:
        up_qid = self._up.get((link, req.queue_id))
        if up_qid is None or not self.connected:
            response_kind = f"{kind}_response"
            code, text = ((ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
                          if up_qid is None else (ResultCode.NOT_CONNECTED, "proxy has no upstream connection"))
            response = pb.Frame()
            body = getattr(response, response_kind)
            body.request_id, body.queue_id = req.request_id, req.queue_id
            body.status.CopyFrom(status(code, text))
            return [(link, response)]
        up_req = next(self._request_ids)
        self._requests[up_req] = _Request(link, req.request_id, kind, up_qid)
        frame = pb.Frame()
        body = getattr(frame, kind)
        body.CopyFrom(req)
        body.queue_id, body.request_id = up_qid, up_req
        return [(UPSTREAM, frame)]

    def _put(self, link: Hashable, batch: pb.PutBatch) -> Out:
        out_messages, nacks = [], []
        for message in batch.messages:
            up_qid = self._up.get((link, message.queue_id))
            if up_qid is None or not self.connected:
                code, text = ((ResultCode.INVALID_ARGUMENT, f"queue id {message.queue_id} is not open")
                              if up_qid is None else (ResultCode.NOT_CONNECTED, "proxy has no upstream"))
                nacks.append(pb.AckMessage(queue_id=message.queue_id, guid=message.guid, code=wire(code),
                                           message=text))
                continue
            message.queue_id = up_qid
            self._unacked[(up_qid, message.guid)] = None
            out_messages.append(message)
        out: Out = []
        if out_messages:
            out.append((UPSTREAM, pb.Frame(put=pb.PutBatch(messages=out_messages))))
        if nacks:
            out.append((link, pb.Frame(ack=pb.AckBatch(messages=nacks))))
        return out

    def _put_columns(self, link: Hashable, req: pb.PutColumns) -> Out:
        from protocol import columns  # pyarrow only when columnar PUTs are used
        table = columns.decode(req.arrow_ipc)
        if isinstance(table, str):  # no GUID is known: a frame error is all that can be said
            return [(link, pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, table))))]
        guids = columns.guids_of(table)
        up_qid = self._up.get((link, req.queue_id))
        if up_qid is None or not self.connected:
            code, text = ((ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open") if up_qid is None
                          else (ResultCode.NOT_CONNECTED, "proxy has no upstream"))
            return [(link, pb.Frame(ack_columns=pb.AckColumns(queue_id=req.queue_id, guids=guids, code=wire(code),
                                                              message=text)))]
        self._unacked_columns[(up_qid, guids)] = None
        return [(UPSTREAM, pb.Frame(put_columns=pb.PutColumns(queue_id=up_qid, arrow_ipc=req.arrow_ipc)))]

    def _confirm(self, link: Hashable, batch: pb.ConfirmBatch) -> Out:
        messages = []
        for message in batch.messages:
            up_qid = self._up.get((link, message.queue_id))
            if up_qid is not None:
                messages.append(pb.ConfirmMessage(queue_id=up_qid, guid=message.guid))
        return [(UPSTREAM, pb.Frame(confirm=pb.ConfirmBatch(messages=messages)))] if messages else []

    def _stop(self, link: Hashable, req: pb.StopRequest) -> Out:
        # Stop sending PUSHes to a stopping client: pause its consumers upstream.
        out: Out = []
        for (owner, _), up_qid in self._up.items():
            if owner == link and self._routes[up_qid].read:
                out.append((UPSTREAM, pb.Frame(configure_queue=pb.ConfigureQueue(
                    request_id=0, queue_id=up_qid, options=pb.QueueOptions()))))
        out.append((link, pb.Frame(stop_response=pb.StopResponse(request_id=req.request_id))))
        return out

    def downstream_closed(self, link: Hashable) -> Out:
        """Close upstream every queue the departed link had open (the primary
        then redelivers its unconfirmed messages)."""
        out: Out = []
        for (owner, down_qid), up_qid in list(self._up.items()):
            if owner != link:
                continue
            del self._up[(owner, down_qid)]
            del self._routes[up_qid]
            out.append((UPSTREAM, pb.Frame(close_queue=pb.CloseQueue(request_id=0, queue_id=up_qid))))
        for key in [r for r, req in self._requests.items() if req.link == link]:
            del self._requests[key]
        # Unacked PUTs of the link stay tracked until their ACK (then dropped).
        return out

    # -- upstream -> downstream ---------------------------------------------
    def from_upstream(self, frame: pb.Frame) -> Out:
        kind = frame.WhichOneof("body")
        if kind == "ack":
            return self._route_batch(frame.ack.messages, "ack", pb.AckBatch, track_acks=True)
        if kind == "push":
            return self._route_batch(frame.push.messages, "push", pb.PushBatch)
        if kind == "ack_columns":
            ack = frame.ack_columns
            self._unacked_columns.pop((ack.queue_id, ack.guids), None)
            route = self._routes.get(ack.queue_id)
            if route is None:
                return []
            ack.queue_id = route.queue_id
            return [(route.link, pb.Frame(ack_columns=ack))]
        if kind in ("open_queue_response", "configure_queue_response", "close_queue_response"):
            return self._response(kind, getattr(frame, kind))
        if kind == "error":
            request = self._requests.pop(frame.error.request_id, None)
            if request is not None:
                error = pb.FrameError(request_id=request.request_id, status=frame.error.status)
                return [(request.link, pb.Frame(error=error))]
        return []  # heartbeats and stop responses to the relay itself

    def _route_batch(self, messages, field: str, batch_type, track_acks: bool = False) -> Out:
        by_link: dict[Hashable, list] = {}
        for message in messages:
            if track_acks:
                self._unacked.pop((message.queue_id, message.guid), None)
            route = self._routes.get(message.queue_id)
            if route is None:
                continue  # the downstream link is gone; the primary redelivers PUSHes
            message.queue_id = route.queue_id
            by_link.setdefault(route.link, []).append(message)
        out: Out = []
        for link, items in by_link.items():
            frame = pb.Frame()
            getattr(frame, field).CopyFrom(batch_type(messages=items))
            out.append((link, frame))
        return out

    def _response(self, kind: str, body) -> Out:
        request = self._requests.pop(body.request_id, None)
        if request is None:
            return []
        route = self._routes.get(request.upstream_queue_id)
        if route is None:
            return []
        failed = body.status.code != ResultCode.SUCCESS
        if (kind == "open_queue_response" and failed) or kind == "close_queue_response":
            self._up.pop((route.link, route.queue_id), None)
            self._routes.pop(request.upstream_queue_id, None)
        body.request_id, body.queue_id = request.request_id, route.queue_id
        frame = pb.Frame()
        getattr(frame, kind).CopyFrom(body)
        return [(request.link, frame)]

    def upstream_lost(self, reason: str) -> Out:
        """Answer every PUT still in flight (UNKNOWN) and forget all routes; the
        owner closes the downstream links so that clients reconnect."""
        self.connected = False
        by_link: dict[Hashable, list[pb.AckMessage]] = {}
        for up_qid, guid in self._unacked:
            route = self._routes.get(up_qid)
            if route is not None:
                by_link.setdefault(route.link, []).append(pb.AckMessage(
                    queue_id=route.queue_id, guid=guid, code=wire(ResultCode.UNKNOWN), message=reason))
        out: Out = [(link, pb.Frame(ack=pb.AckBatch(messages=acks))) for link, acks in by_link.items()]
        for up_qid, guids in self._unacked_columns:
            route = self._routes.get(up_qid)
            if route is not None:
                out.append((route.link, pb.Frame(ack_columns=pb.AckColumns(
                    queue_id=route.queue_id, guids=guids, code=wire(ResultCode.UNKNOWN), message=reason))))
        self._unacked_columns.clear()
        self._unacked.clear()
        self._up.clear()
        self._routes.clear()
        self._requests.clear()
        return out
