"""A cluster node acting as primary for its partitions: frame handling.

Every inbound frame is validated before anything is accepted; bad input gets a
clear status (`INVALID_ARGUMENT`, `REFUSED`, ...) on that request or message
only, and the stream and every other client carry on.
"""

from __future__ import annotations

import logging
import threading
import zlib
from dataclasses import dataclass

from conf import ClusterConfig
from primary.dispatcher import ConsumerOptions
from primary.partition import Partition, PendingConfirm, PendingPut, QueueState, send_acks
from protocol import ResultCode, parse_queue_uri, pb, status, wire
from protocol.properties import validate_wire
from protocol.stream import Link
from protocol.uri import QueueUri

log = logging.getLogger(__name__)
GUID_LENGTH = 16


@dataclass
class OpenHandle:
    uri: QueueUri
    read: bool
    write: bool
    state: QueueState
    partition: Partition


def partition_of(uri: QueueUri, partitions: int) -> int:
    """Stable queue -> partition mapping (crc32 of the canonical URI)."""
    return zlib.crc32(uri.canonical.encode()) % partitions


def consumer_options(options: pb.QueueOptions | None, defaults: ConsumerOptions) -> ConsumerOptions | str:
    if options is None:
        return defaults
    if options.max_unconfirmed_messages < 0 or options.max_unconfirmed_bytes < 0:
        return "max_unconfirmed_messages and max_unconfirmed_bytes must be >= 0"
    if not -(2**30) <= options.consumer_priority <= 2**30:
        return "consumer_priority must be within [-2^30, 2^30]"
    return ConsumerOptions(options.max_unconfirmed_messages, options.max_unconfirmed_bytes,
                           options.consumer_priority)


class Node:
    def __init__(self, config: ClusterConfig, name: str):
        self.config = config
        self.name = name
        self.partitions = [Partition(i, config) for i in range(config.partitions)]
        self._handles: dict[Link, dict[int, OpenHandle]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        for partition in self.partitions:
            partition.start()

    def stop(self) -> None:
        for partition in self.partitions:
            partition.stop()

    def notify_delivery(self, partition: int) -> None:
        if 0 <= partition < len(self.partitions):
            self.partitions[partition].notify_delivery()

    # -- links --------------------------------------------------------------
    def open_link(self, link: Link) -> None:
        with self._lock:
            self._handles[link] = {}

    def close_link(self, link: Link) -> None:
        with self._lock:
            handles = self._handles.pop(link, {})
        for queue_id, handle in handles.items():
            self._detach(link, queue_id, handle)

    def _detach(self, link: Link, queue_id: int, handle: OpenHandle) -> None:
        if handle.read:
            with handle.partition.lock:
                pushes = handle.state.dispatcher.remove_consumer((link, queue_id))
            handle.partition.on_pushes(pushes)

    # -- frames -------------------------------------------------------------
    def on_frame(self, link: Link, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        handler = {
            "open_queue": self._on_open,
            "configure_queue": self._on_configure,
            "close_queue": self._on_close,
            "put": self._on_put,
            "confirm": self._on_confirm,
            "stop_request": self._on_stop,
            "heartbeat": self._on_heartbeat,
        }.get(kind or "")
        if handler is None:
            reason = "empty frame" if kind is None else f"a {kind} frame is not valid from a client"
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, reason))))
            return
        handler(link, getattr(frame, kind))

    def _handles_of(self, link: Link) -> dict[int, OpenHandle]:
        with self._lock:
            return self._handles.get(link, {})

    def _on_open(self, link: Link, req: pb.OpenQueue) -> None:
        def reply(code: ResultCode, message: str = "", max_payload: int = 0) -> None:
            link.send(pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(code, message),
                max_payload_bytes=max_payload)))

        uri = parse_queue_uri(req.uri)
        if isinstance(uri, str):
            return reply(ResultCode.INVALID_ARGUMENT, uri)
        domain = self.config.domains.get(uri.domain)
        if domain is None:
            return reply(ResultCode.REFUSED, f"unknown domain {uri.domain!r}")
        if uri.app_id and domain.mode != "fanout":
            return reply(ResultCode.INVALID_ARGUMENT,
                         f"?id= is only for fanout domains; {uri.domain!r} is {domain.mode}")
        if not (req.read or req.write):
            return reply(ResultCode.INVALID_ARGUMENT, "open for read, write or both")
        defaults = ConsumerOptions(domain.max_unconfirmed_messages_default,
                                   domain.max_unconfirmed_bytes_default, 0)
        options = consumer_options(req.options if req.HasField("options") else None, defaults)
        if isinstance(options, str):
            return reply(ResultCode.INVALID_ARGUMENT, options)
        handles = self._handles_of(link)
        if req.queue_id in handles:
            return reply(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is already open on this session")
        partition = self.partitions[partition_of(uri, len(self.partitions))]
        state = partition.queue_state(uri, domain)
        handle = OpenHandle(uri, req.read, req.write, state, partition)
        handles[req.queue_id] = handle
        reply(ResultCode.SUCCESS, max_payload=domain.max_payload_bytes)
        if req.read:
            with partition.lock:
                pushes = state.dispatcher.add_consumer((link, req.queue_id), options)
            partition.on_pushes(pushes)

    def _on_configure(self, link: Link, req: pb.ConfigureQueue) -> None:
        def reply(code: ResultCode, message: str = "") -> None:
            link.send(pb.Frame(configure_queue_response=pb.ConfigureQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(code, message))))

        handle = self._handles_of(link).get(req.queue_id)
        if handle is None:
            return reply(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
        if not handle.read:
            return reply(ResultCode.REFUSED, "queue is not open for reading")
        options = consumer_options(req.options, ConsumerOptions())
        if isinstance(options, str):
            return reply(ResultCode.INVALID_ARGUMENT, options)
        with handle.partition.lock:
            pushes = handle.state.dispatcher.configure_consumer((link, req.queue_id), options)
        reply(ResultCode.SUCCESS)
        handle.partition.on_pushes(pushes)

    def _on_close(self, link: Link, req: pb.CloseQueue) -> None:
        handle = self._handles_of(link).pop(req.queue_id, None)
        code, message = (ResultCode.SUCCESS, "") if handle else (
            ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
        if handle:
            self._detach(link, req.queue_id, handle)
        link.send(pb.Frame(close_queue_response=pb.CloseQueueResponse(
            request_id=req.request_id, queue_id=req.queue_id, status=status(code, message))))

    def _on_put(self, link: Link, batch: pb.PutBatch) -> None:
        handles = self._handles_of(link)
        nacks: list[tuple[Link, pb.AckMessage]] = []
        accepted: dict[Partition, tuple[list[PendingPut], int]] = {}
        for message in batch.messages:
            handle = handles.get(message.queue_id)
            reason: tuple[ResultCode, str] | None = None
            if handle is None:
                reason = (ResultCode.INVALID_ARGUMENT, f"queue id {message.queue_id} is not open")
            elif not handle.write:
                reason = (ResultCode.REFUSED, "queue is not open for writing")
            elif len(message.guid) != GUID_LENGTH:
                reason = (ResultCode.INVALID_ARGUMENT, f"GUID must be {GUID_LENGTH} bytes, got {len(message.guid)}")
            elif len(message.payload) > handle.state.domain.max_payload_bytes:
                reason = (ResultCode.INVALID_ARGUMENT, f"payload of {len(message.payload)} bytes exceeds "
                          f"the domain's max_payload_bytes {handle.state.domain.max_payload_bytes}")
            else:
                prop_reason = validate_wire(message.properties)
                if prop_reason:
                    reason = (ResultCode.INVALID_ARGUMENT, prop_reason)
            if reason is not None or handle is None:
                code, text = reason or (ResultCode.UNKNOWN, "")
                nacks.append((link, pb.AckMessage(queue_id=message.queue_id, guid=message.guid,
                                                  code=wire(code), message=text)))
                continue
            items, nbytes = accepted.setdefault(handle.partition, ([], 0))
            items.append(PendingPut(link, message.queue_id, handle.state, message))
            accepted[handle.partition] = (items, nbytes + len(message.payload))
        for partition, (items, nbytes) in accepted.items():
            if not partition.put_committer.submit(items, nbytes):
                nacks.extend((i.link, pb.AckMessage(
                    queue_id=i.queue_id, guid=i.message.guid, code=wire(ResultCode.LIMIT_MESSAGES),
                    message="primary's pending PUT buffer is full")) for i in items)
        if nacks:
            send_acks(nacks)

    def _on_confirm(self, link: Link, batch: pb.ConfirmBatch) -> None:
        handles = self._handles_of(link)
        by_partition: dict[Partition, tuple[list[PendingConfirm], list]] = {}
        for message in batch.messages:
            handle = handles.get(message.queue_id)
            if handle is None or not handle.read:
                # A confirm for a queue this link does not read is dropped: the
                # message stays with whoever holds it (at-least-once).
                continue
            confirms, pushes = by_partition.setdefault(handle.partition, ([], []))
            with handle.partition.lock:
                stored, more = handle.state.dispatcher.confirm((link, message.queue_id), message.guid)
            pushes.extend(more)
            if stored is not None:
                confirms.append(PendingConfirm(handle.state, handle.uri.app_id, stored))
        for partition, (confirms, pushes) in by_partition.items():
            if confirms:
                partition.confirm_committer.submit(confirms, 0)
            partition.on_pushes(pushes)

    def _on_stop(self, link: Link, req: pb.StopRequest) -> None:
        # The peer is stopping: send it no new PUSHes (its consumers pause and
        # keep what they hold until they confirm or the link closes), then answer.
        for queue_id, handle in list(self._handles_of(link).items()):
            if handle.read:
                with handle.partition.lock:
                    handle.state.dispatcher.configure_consumer((link, queue_id), ConsumerOptions(0, 0, 0))
        link.send(pb.Frame(stop_response=pb.StopResponse(request_id=req.request_id)))

    def _on_heartbeat(self, link: Link, beat: pb.Heartbeat) -> None:
        link.send(pb.Frame(heartbeat=beat))
