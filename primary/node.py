"""A cluster node: the frames of every link, handled by job.

A node is primary for the partitions whose lease it holds and a replica for
the rest. `Node` handles the frames and composes the jobs, each in a module
of its own:

- leadership and failover: `primary.leadership` (leases, recovery, stepping down);
- admission: `primary.admission` (pure: whether an open, configure or PUT is
  taken, as a coded refusal) and the domain's quota (`QueueState.admit`);
- replica forwarding: `replicas.forwarding` (queues of partitions led elsewhere);
- storage and delivery: `primary.partition`.

Every inbound frame is checked before anything is accepted; bad input gets a
clear status (`INVALID_ARGUMENT`, `REFUSED`, ...) on that request or message
only, and the stream and every other client carry on. Nothing waits on a
link's reader thread: an open whose partition has no primary yet (a failover)
is parked and answered when the partition is served here or found elsewhere,
or NOT_READY after `2 * ha.lease_duration_ms + PARTITION_READY_WAIT_S`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import conf
from conf import ClusterConfig, DomainConfig
from primary import admission
from primary.admission import PAUSED, Open, Refusal
from primary.dispatcher import ConsumerOptions, QueueDispatcher, StoredMessage
from primary.leadership import Leadership, Where
from primary.metrics import NodeMetrics
from primary.partition import (
    ConfirmEntry,
    ConfirmRange,
    Partition,
    PendingColumns,
    PendingPut,
    QueueState,
    id_runs,
    push_run,
    send_acks,
)
from primary.quota import DomainQuota
from protocol import ResultCode, columns, pb, status, wire
from protocol import seqs as seq_ranges
from protocol.clock import wall_time_us
from protocol.stream import Link
from protocol.uri import QueueUri, partition_of
from replicas.forwarding import Forwarding
from replicas.upstream import STOP_FLUSH_S

log = logging.getLogger(__name__)
DOMAIN_POLL_S = 1.0
PARTITION_READY_WAIT_S = 30.0


@dataclass
class OpenHandle:
    uri: QueueUri
    read: bool
    write: bool
    state: QueueState
    partition: Partition
    link: str = ""       # opened by that cluster's pull link (OpenQueue.link)

    @property
    def app(self) -> str:
        return self.uri.app_id or ""

    @property
    def broadcast(self) -> bool:
        return self.state.domain.mode == "broadcast"


@dataclass
class _Parked:
    """An open waiting for its partition's primary."""
    link: Link
    req: pb.OpenQueue
    checked: Open
    partition: int
    deadline_s: float


class Node:
    """A cluster node: primary for the partitions whose lease it holds, and a
    replica for the rest, relaying their queues' traffic to their primary. A
    partition whose lease is lost stops at once, and the links with queues on
    it are ended so that the hops below resend to the new primary."""

    def __init__(self, config: ClusterConfig, name: str, domains_dir: Path | None = None):
        self.config = config
        self.routes = admission.Routes.of(config)   # queue@cluster (links come from cluster.toml: fixed)
        self.name = name
        self.address = ""
        self._quotas: dict[str, DomainQuota] = {
            d.name: DomainQuota(d) for d in config.domains.values() if d.has_quota}
        self._handles: dict[Link, dict[int, OpenHandle]] = {}
        self._parked: list[_Parked] = []
        self._lock = threading.Lock()
        self._domains_dir = domains_dir
        self._domain_stamp = conf.domain_files(domains_dir) if domains_dir else {}
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_domains, name="domain-watcher", daemon=True)
        self.leadership = Leadership(config, name, serve=self._serve, stepped_down=self._stepped_down,
                                     changed=self._resume_parked)
        self.forwarding = Forwarding(self.leadership.leader_addresses, name, config.ha.retransmission,
                                     conf.client_tls(config), conf.cluster_token(config))
        self._stopped_links: set[Link] = set()              # peers that answered our StopRequest
        self.metrics = NodeMetrics(config.metrics.max_queue_series)

    @property
    def partitions(self) -> dict[int, Partition]:
        """The partitions this node leads and serves."""
        return self.leadership.partitions

    def start(self, address: str = "") -> None:
        """Start taking leases. `address` is where this node serves (written
        into the lease so other nodes can relay to it)."""
        self.address = address or self.config.node(self.name).address
        self.leadership.start(self.address)
        if self._domains_dir is not None:
            self._watcher.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every partition has a known primary (this node or another)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.leadership.all_known():
                return True
            time.sleep(0.05)
        return False

    def stop(self, graceful: bool = True) -> None:
        """Stop; gracefully (the default) means drain first (`drain`), then hand
        every lease over at once instead of letting it lapse."""
        if self._stopping.is_set():
            return
        if graceful:
            self.drain()
        self._stopping.set()
        self.leadership.stop()
        self.forwarding.stop(STOP_FLUSH_S if graceful else 0.0)
        for partition in list(self.partitions.values()):
            partition.stop()
        # End every stream: the peers move to their next host at once.
        for link in self._links():
            link.close()

    def _links(self) -> set[Link]:
        with self._lock:
            return set(self._handles) | self.forwarding.links | {p.link for p in self._parked}

    def drain(self) -> None:
        """Graceful stop, BlazingMQ's StopRequest: push nothing new, ask every
        peer below to stop sending PUTs (they keep them in their buffers for
        the next primary), then wait until every PUT received is committed and
        ACKed and every message pushed is confirmed, or `ha.stop_timeout_ms`.
        ACKs and CONFIRMs keep flowing the whole time."""
        deadline = time.monotonic() + self.config.ha.stop_timeout_ms / 1000
        links = self._links()
        for link in links:
            self._pause(link)
            link.send(pb.Frame(stop_request=pb.StopRequest(
                request_id=1, timeout_ms=self.config.ha.stop_timeout_ms)))
        self.forwarding.pause_consumers()  # consumers below relayed queues: nothing new either

        def answered() -> bool:
            with self._lock:
                return all(link in self._stopped_links or link.closed for link in links)

        def drained() -> bool:
            partitions = list(self.partitions.values())
            unconfirmed = 0
            for partition in partitions:
                with partition.lock:
                    unconfirmed += sum(d.unconfirmed_count for s in partition.queues.values()
                                       for d in s.dispatchers.values())
            return (unconfirmed == 0 and all(p.put_committer.idle and p.confirm_committer.idle for p in partitions)
                    and self.forwarding.drained)

        for what, done in (("StopResponses", answered), ("ACKs and CONFIRMs", drained)):
            while not done() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not done():
                log.warning("node %s: stop timeout (%d ms) reached waiting for %s; going anyway", self.name,
                            self.config.ha.stop_timeout_ms, what)
                return
        log.info("node %s: drained", self.name)

    def _pause(self, link: Link) -> None:
        """Push nothing more to the consumers of `link` (they keep what they
        hold until they confirm it or the link closes)."""
        for queue_id, handle in list(self._handles_of(link).items()):
            if handle.read:
                handle.partition.route(handle.state, handle.app, functools.partial(
                    QueueDispatcher.configure_consumer, key=(link, queue_id), options=PAUSED))

    def notify_delivery(self, partition: int) -> None:
        led = self.partitions.get(partition)
        if led is not None:
            led.notify_delivery()

    # -- leadership ---------------------------------------------------------------
    def _serve(self, p: int, epoch: int) -> Partition:
        """A lease was won: fence and recover the partition (Leadership counts
        it as served once this returns)."""
        partition = Partition(p, self.config, epoch=epoch, quota_for=self._quotas.get,
                              on_fenced=functools.partial(self.leadership.fenced, p),
                              local_address=lambda: self.address, metrics=self.metrics)
        partition.start()
        self.metrics.partitions_taken += 1
        return partition

    def _stepped_down(self, p: int, partition: Partition) -> None:
        self.metrics.partitions_lost += 1
        # End every link with queues here: the hops below keep their PUTs and
        # reopen through whichever node they reach next.
        with self._lock:
            doomed = [link for link, handles in self._handles.items()
                      if any(h.partition is partition for h in handles.values())]
        for link in doomed:
            link.close()
        threading.Thread(target=partition.stop, name=f"stop-{p}", daemon=True).start()

    # -- configuration reload -------------------------------------------------
    def _watch_domains(self) -> None:
        """Reload the domains when a file changes, for the node's whole life: a
        bad file is logged and the last good configuration stays; nothing ends
        this thread but the node's stop."""
        assert self._domains_dir is not None
        while not self._stopping.wait(DOMAIN_POLL_S):
            try:
                stamp = conf.domain_files(self._domains_dir)
                if stamp == self._domain_stamp:
                    continue
                self._domain_stamp = stamp
                self.reload_domains(conf.load_domains(self._domains_dir))
            except conf.ConfigError as exc:
                log.error("domain reload rejected, keeping the previous configuration: %s", exc)
            except Exception:
                log.exception("domain reload failed, keeping the previous configuration")

    def reload_domains(self, domains: dict[str, DomainConfig]) -> None:
        """Apply new domain definitions to a running node. A domain whose mode
        would change while it has queues keeps its old definition (its stored
        messages were routed for the old mode); everything else applies at once:
        limits, TTL, delivery attempts, apps and subscriptions. A removed
        domain refuses new opens; its open queues carry on."""
        old = self.config.domains
        merged = dict(domains)
        active = {key[0] for p in self.partitions.values() for key in p.queues}
        for name, domain in domains.items():
            previous = old.get(name)
            if previous is not None and previous.mode != domain.mode and name in active:
                log.error("domain %s: mode change %s -> %s refused while it has queues; restart with "
                          "an empty domain to change it", name, previous.mode, domain.mode)
                merged[name] = previous
        for name, domain in merged.items():
            quota = self._quotas.get(name)
            if domain.has_quota:
                if quota is None:
                    self._quotas[name] = DomainQuota(domain)
                else:
                    quota.domain = domain
            else:
                self._quotas.pop(name, None)
        self.config = dataclasses.replace(self.config, domains=merged)
        for partition in list(self.partitions.values()):
            partition.config = self.config
            with partition.lock:
                for (name, _), state in partition.queues.items():
                    if name in merged:
                        state.set_domain(merged[name], self._quotas.get(name))
        log.info("domains reloaded: %s", ", ".join(f"{n} ({d.mode})" for n, d in sorted(merged.items())))

    # -- links --------------------------------------------------------------
    def open_link(self, link: Link) -> None:
        link.observer = self.metrics.frames.observe
        with self._lock:
            self._handles[link] = {}

    def close_link(self, link: Link) -> None:
        with self._lock:
            handles = self._handles.pop(link, {})
            self._parked = [p for p in self._parked if p.link is not link]
        for queue_id, handle in handles.items():
            self._detach(link, queue_id, handle)
        self.forwarding.close_link(link)

    def _detach(self, link: Link, queue_id: int, handle: OpenHandle) -> None:
        with handle.partition.lock:
            handle.state.consumers -= handle.read
            handle.state.producers -= handle.write
        if handle.read:
            link.columnar.discard(queue_id)
            link.push_groups.pop(queue_id, None)
            link.broadcast.discard(queue_id)
            handle.partition.route(handle.state, handle.app, lambda d: d.remove_consumer((link, queue_id)))
            handle.partition.consumer_closed(handle.state, handle.app, (link, queue_id))

    def _handles_of(self, link: Link) -> dict[int, OpenHandle]:
        with self._lock:
            return self._handles.get(link, {})

    # -- frames -------------------------------------------------------------
    # Frames whose handlers wait on no I/O and no commit (admission, then a
    # place in the group commit or an answer; a relayed queue's part goes to
    # its upstream's buffer; a broadcast PUT takes the push lock, which a
    # commit holds only while it routes in memory): handled on the gRPC
    # loop's thread, which saves two thread hand-offs per frame
    # (`serve_session`). Opens may wait for a partition, and a CONFIRM
    # dispatches what it frees: those go to the frame pool.
    INLINE_FRAMES = frozenset({"put", "put_columns", "heartbeat"})

    @staticmethod
    def handled_inline(frame: pb.Frame) -> bool:
        return frame.WhichOneof("body") in Node.INLINE_FRAMES

    def on_frame(self, link: Link, frame: pb.Frame) -> None:
        self.metrics.frames.received(frame)
        local = self.forwarding.split(link, frame)
        if local is None:
            return
        kind = local.WhichOneof("body")
        handler = {
            "open_queue": self._on_open,
            "configure_queue": self._on_configure,
            "close_queue": self._on_close,
            "put": self._on_put,
            "put_columns": self._on_put_columns,
            "confirm": self._on_confirm,
            "confirm_columns": self._on_confirm_columns,
            "stop_request": self._on_stop,
            "stop_response": self._on_stop_response,
            "heartbeat": self._on_heartbeat,
        }.get(kind or "")
        if handler is None:
            reason = "empty frame" if kind is None else f"a {kind} frame is not valid from a client"
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, reason))))
            return
        handler(link, getattr(local, kind))

    def _reply_open(self, link: Link, req: pb.OpenQueue, refusal: Refusal | None,
                    checked: Open | None = None) -> None:
        """The answer to an open: its refusal, or (with `checked`) its success
        with the domain's limits and the consumer options in force."""
        response = pb.OpenQueueResponse(request_id=req.request_id, queue_id=req.queue_id)
        if checked is not None:
            response.dedup_history_window_ms = checked.domain.dedup_history_window_ms
        if refusal is not None:
            response.status.CopyFrom(status(refusal.code, refusal.message))
        else:
            assert checked is not None
            response.status.CopyFrom(status(ResultCode.SUCCESS))
            response.max_payload_bytes = checked.domain.max_payload_bytes
            response.broadcast = checked.domain.mode == "broadcast"
            response.partition = partition_of(checked.uri, self.config.partitions)
            if req.read:
                effective = checked.options
                response.options.CopyFrom(pb.QueueOptions(
                    max_unconfirmed_messages=effective.max_unconfirmed_messages,
                    max_unconfirmed_bytes=effective.max_unconfirmed_bytes,
                    consumer_priority=effective.priority,
                    subscriptions=[s.text for s in effective.subscriptions]))
        link.send(pb.Frame(open_queue_response=response))

    def _on_open(self, link: Link, req: pb.OpenQueue) -> None:
        checked = admission.check_open(req, self.config.domains, self.routes)
        if isinstance(checked, Refusal):
            return self._reply_open(link, req, checked)
        with self._lock:
            taken = req.queue_id in self._handles.get(link, {}) or self.forwarding.relays(link, req.queue_id) \
                or any(p.link is link and p.req.queue_id == req.queue_id for p in self._parked)
        if taken:
            return self._reply_open(link, req, Refusal(
                ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is already open on this session"), checked)
        index = partition_of(checked.uri, self.config.partitions)
        if self.leadership.where(index) is Where.UNKNOWN:
            # A failover: park it rather than block this link's other frames.
            deadline = time.monotonic() + 2 * self.config.ha.lease_duration_ms / 1000 + PARTITION_READY_WAIT_S
            with self._lock:
                self._parked.append(_Parked(link, req, checked, index, deadline))
            return
        self._open_at(link, req, checked, index)

    def _resume_parked(self) -> None:
        """After every lease round: answer the parked opens whose partition is
        now served here or led elsewhere, and NOT_READY those out of time."""
        if not self._parked:
            return
        now = time.monotonic()
        with self._lock:
            ready = [p for p in self._parked if p.link.closed or now >= p.deadline_s
                     or self.leadership.where(p.partition) is not Where.UNKNOWN]
            self._parked = [p for p in self._parked if p not in ready]
        if ready:  # not on the lease keeper's thread: opening takes partition locks
            threading.Thread(target=self._answer_parked, args=(ready,), name="parked-opens", daemon=True).start()

    def _answer_parked(self, ready: list[_Parked]) -> None:
        for parked in ready:
            if parked.link.closed:
                continue
            try:
                if self.leadership.where(parked.partition) is Where.UNKNOWN:
                    self._reply_open(parked.link, parked.req, Refusal(
                        ResultCode.NOT_READY, f"partition {parked.partition} has no primary yet "
                        "(failover in progress)"), parked.checked)
                else:
                    self._open_at(parked.link, parked.req, parked.checked, parked.partition)
            except Exception:
                log.exception("%r: a parked open failed", parked.link)
                self._reply_open(parked.link, parked.req, Refusal(ResultCode.UNKNOWN, "internal error"),
                                 parked.checked)

    def _open_at(self, link: Link, req: pb.OpenQueue, checked: Open, index: int) -> None:
        partition = self.partitions.get(index)
        if partition is None:
            # Another node is this partition's primary: relay the queue there.
            self.forwarding.open(link, req, index)
            return
        uri, domain = checked.uri, checked.domain
        state = partition.queue_state(uri, domain)
        with partition.lock:
            refused = admission.check_capacity(domain, str(state.uri), req.read, req.write, state.consumers,
                                               state.producers)
            if refused is None:
                state.consumers += req.read
                state.producers += req.write
        if refused is not None:
            return self._reply_open(link, req, refused, checked)
        handle = OpenHandle(uri, req.read, req.write, state, partition, req.link)
        with self._lock:
            handles = self._handles.get(link)
            if handles is not None:
                handles[req.queue_id] = handle
        if handles is None:  # the link closed meanwhile
            self._detach(link, req.queue_id, handle)
            return
        self._reply_open(link, req, None, checked)
        if req.read:
            if req.columnar_push:
                link.push_groups[req.queue_id] = req.push_group
                link.columnar.add(req.queue_id)
            if handle.broadcast:
                link.broadcast.add(req.queue_id)
            options = admission.for_link(checked.options, req.link)
            partition.route(state, handle.app, lambda d: d.add_consumer((link, req.queue_id), options))
            partition.consumer_opened(state, handle.app, (link, req.queue_id), checked.options, req.link)

    def _on_configure(self, link: Link, req: pb.ConfigureQueue) -> None:
        def reply(code: ResultCode, message: str = "") -> None:
            link.send(pb.Frame(configure_queue_response=pb.ConfigureQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(code, message))))

        handle = self._handles_of(link).get(req.queue_id)
        if handle is None:
            return reply(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
        if not handle.read:
            return reply(ResultCode.REFUSED, "queue is not open for reading")
        options = admission.consumer_options(req.options, ConsumerOptions())
        if isinstance(options, Refusal):
            return reply(options.code, options.message)
        reply(ResultCode.SUCCESS)
        filtered = admission.for_link(options, handle.link)
        handle.partition.route(handle.state, handle.app,
                               lambda d: d.configure_consumer((link, req.queue_id), filtered))
        handle.partition.consumer_opened(handle.state, handle.app, (link, req.queue_id), options, handle.link)

    def _on_close(self, link: Link, req: pb.CloseQueue) -> None:
        with self._lock:
            handle = self._handles.get(link, {}).pop(req.queue_id, None)
            parked = [p for p in self._parked if p.link is link and p.req.queue_id == req.queue_id]
            self._parked = [p for p in self._parked if p not in parked]
        for p in parked:  # closed before its partition had a primary: it never opened
            self._reply_open(link, p.req, Refusal(ResultCode.CANCELED, "closed before it was opened"))
        if parked and handle is None:
            link.send(pb.Frame(close_queue_response=pb.CloseQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(ResultCode.SUCCESS))))
            return
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
        broadcasts: dict[int, tuple[OpenHandle, list[StoredMessage]]] = {}
        arrived_us = wall_time_us()
        for message in batch.messages:
            handle = handles.get(message.queue_id)
            refused: Refusal | None
            if handle is None:
                refused = Refusal(ResultCode.INVALID_ARGUMENT, f"queue id {message.queue_id} is not open")
            elif not handle.write:
                refused = Refusal(ResultCode.REFUSED, "queue is not open for writing")
            else:
                refused = admission.check_put(message, handle.state.domain)
                if refused is None and handle.broadcast:
                    broadcasts.setdefault(message.queue_id, (handle, []))[1].append(StoredMessage(
                        guid=message.guid, seq=0, payload=message.payload, properties=list(message.properties),
                        put_time_us=message.put_time_us, delivery_count=1, compression=message.compression))
                    nacks.append((link, pb.AckMessage(queue_id=message.queue_id, guid=message.guid,
                                                      code=wire(ResultCode.SUCCESS))))
                    continue
                if refused is None:
                    over = handle.state.admit([message.guid], [len(message.payload)])
                    refused = Refusal(*over) if over else None
            if refused is not None or handle is None:
                code, text = (refused.code, refused.message) if refused else (ResultCode.UNKNOWN, "")
                nacks.append((link, pb.AckMessage(queue_id=message.queue_id, guid=message.guid,
                                                  code=wire(code), message=text)))
                continue
            items, nbytes = accepted.setdefault(handle.partition, ([], 0))
            items.append(PendingPut(link, message.queue_id, handle.state, message, arrived_us))
            accepted[handle.partition] = (items, nbytes + len(message.payload))
        for partition, (items, nbytes) in accepted.items():
            if not partition.put_committer.submit(items, nbytes):
                for i in items:
                    i.queue.unadmit([i.message.guid])
                refused = _not_taken(partition)
                nacks.extend((i.link, pb.AckMessage(
                    queue_id=i.queue_id, guid=i.message.guid, code=wire(refused.code),
                    message=refused.message)) for i in items)
        for handle, messages in broadcasts.values():
            self._broadcast(handle, messages)  # handed to the consumers before the ACKs go
        if nacks:
            send_acks(nacks)

    def _on_put_columns(self, link: Link, req: pb.PutColumns) -> None:
        """A columnar batch of PUTs to one queue: checked (the same rules as
        single PUTs, vectorised), admitted, committed and ACKed as a frame. A
        `per_message` frame (single PUTs the SDK put together) is checked and
        admitted row by row, as those PUTs would have been: its ACK names the
        rows refused on their own."""
        table = columns.decode(req.arrow_ipc)
        if isinstance(table, str):
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, table))))
            return
        guids = columns.guids_of(table)
        header = req.guids
        if header and header != guids:
            # Relays keyed the frame by its header: answer with it.
            link.send(columns.ack_columns(req.queue_id, header, ResultCode.INVALID_ARGUMENT,
                                          "the header's GUIDs (PutColumns.guids) are not the rows' GUIDs", {}))
            return
        if req.queue_ids:
            return self._on_put_columns_spanning(link, req, table, guids)
        refused: dict[int, tuple[ResultCode, str]] = {}

        def nack(code: ResultCode, text: str) -> None:
            link.send(columns.ack_columns(req.queue_id, guids, code, text, refused))

        handle = self._handles_of(link).get(req.queue_id)
        if handle is None:
            return nack(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
        if not handle.write:
            return nack(ResultCode.REFUSED, "queue is not open for writing")
        state = handle.state
        reason = columns.check(table, state.domain.max_payload_bytes)
        if reason and req.per_message and table.num_rows:
            for row in range(table.num_rows):
                why = columns.check(table.slice(row, 1), state.domain.max_payload_bytes)
                if why:
                    refused[row] = (ResultCode.INVALID_ARGUMENT, why)
            reason = None if refused else reason
        if reason:
            return nack(ResultCode.INVALID_ARGUMENT, reason)
        sizes = pc.binary_length(table["payload"]).to_pylist()
        if state.quota is not None and not handle.broadcast:
            if req.per_message:
                for row, (guid, size) in enumerate(zip(table["guid"].to_pylist(), sizes)):
                    over = None if row in refused else state.admit([guid], [size])
                    if over is not None:
                        refused[row] = over
            else:
                over = state.admit(table["guid"].to_pylist(), sizes)
                if over is not None:
                    return nack(*over)
        if refused:
            if len(refused) == table.num_rows:
                return nack(ResultCode.SUCCESS, "")   # every row refused on its own
            table = table.filter(pa.array([row not in refused for row in range(table.num_rows)]))
        if handle.broadcast:
            run = push_run(table, [0] * table.num_rows, delivery_count=1)
            handle.partition.route(state, "", lambda d: d.broadcast_run(run))  # to the consumers, then the ACK
            return nack(ResultCode.SUCCESS, "")
        item = PendingColumns(link, req.queue_id, state, table, guids, refused, arrived_us=wall_time_us())
        if not handle.partition.put_committer.submit([item], sum(s for r, s in enumerate(sizes) if r not in refused),
                                                     table.num_rows):
            item.unadmit()
            not_taken = _not_taken(handle.partition)
            nack(not_taken.code, not_taken.message)

    def _on_put_columns_spanning(self, link: Link, req: pb.PutColumns, table: pa.Table, guids: bytes) -> None:
        """A frame of single PUTs to several queues of one partition
        (`PutColumns.queue_ids`): each row checked and admitted on its own
        for its queue, the rows admitted committed together, and one ACK
        frame naming the rows refused. Queues of two partitions in one
        frame, or a broadcast queue, are refused: the SDK makes neither."""
        refused: dict[int, tuple[ResultCode, str]] = {}

        def nack(code: ResultCode, text: str) -> None:
            link.send(columns.ack_columns(req.queue_id, guids, code, text, refused))

        ids = list(req.queue_ids)
        rows = table.num_rows
        if len(ids) != rows:
            return nack(ResultCode.INVALID_ARGUMENT, f"PutColumns names {len(ids)} queue ids for {rows} rows")
        if not req.per_message:
            return nack(ResultCode.INVALID_ARGUMENT, "a PUT frame spanning queues is checked row by row: "
                        "set per_message")
        handles = self._handles_of(link)
        usable: dict[int, OpenHandle] = {}
        closed: dict[int, tuple[ResultCode, str]] = {}
        for queue_id in dict.fromkeys(ids):
            handle = handles.get(queue_id)
            if handle is None:
                closed[queue_id] = (ResultCode.INVALID_ARGUMENT, (
                    f"queue id {queue_id} is of a partition led by another primary; one PUT frame spans "
                    "queues of one partition" if self.forwarding.relays(link, queue_id)
                    else f"queue id {queue_id} is not open"))
            elif not handle.write:
                closed[queue_id] = (ResultCode.REFUSED, "queue is not open for writing")
            elif handle.broadcast:
                closed[queue_id] = (ResultCode.INVALID_ARGUMENT, "a broadcast queue takes PUTs of its own "
                                    "(PutBatch, or PutColumns with queue_id)")
            else:
                usable[queue_id] = handle
        partitions = {h.partition for h in usable.values()}
        if len(partitions) > 1:
            return nack(ResultCode.INVALID_ARGUMENT, "a PUT frame spans queues of partitions "
                        f"{', '.join(str(p.index) for p in sorted(partitions, key=lambda p: p.index))}; "
                        "one frame per partition (OpenQueueResponse.partition)")
        limits = {h.state.domain.max_payload_bytes for h in usable.values()}
        reason = columns.check(table, max(limits, default=0))
        runs = None
        if not closed and reason is None and len(limits) == 1 and all(h.state.quota is None for h in usable.values()):
            runs = _runs_if_grouped(ids, usable)   # every row admitted, queue by queue already: nothing per row
        if runs is not None:
            nbytes = pc.sum(pc.binary_length(table["payload"])).as_py() or 0
        else:
            runs, table, nbytes = self._admit_rows(table, ids, usable, closed, refused, reason, len(limits) > 1)
            if not runs:
                return nack(ResultCode.SUCCESS, "")   # every row refused on its own
        partition = next(iter(partitions))
        item = PendingColumns(link, req.queue_id, runs[0][0], table, guids, refused, runs, wall_time_us())
        if not partition.put_committer.submit([item], nbytes, table.num_rows):
            item.unadmit()
            not_taken = _not_taken(partition)
            nack(not_taken.code, not_taken.message)

    @staticmethod
    def _admit_rows(table: pa.Table, ids: list[int], usable: dict[int, OpenHandle],
                    closed: dict[int, tuple[ResultCode, str]], refused: dict[int, tuple[ResultCode, str]],
                    reason: str | None, limits: bool) -> tuple[list[tuple[QueueState, int]], pa.Table, int]:
        """A spanning frame's rows checked and admitted one by one (a queue
        not open, a row over its queue's limit, a quota): the runs of the
        rows admitted, those rows queue by queue, and their bytes; the
        others into `refused`."""
        sizes = pc.binary_length(table["payload"]).to_pylist()
        row_guids = table["guid"].to_pylist()
        # The admitted rows of each queue, in the frame's order.
        groups: dict[int, tuple[QueueState, list[int]]] = {}
        for row, queue_id in enumerate(ids):
            if queue_id in closed:
                refused[row] = closed[queue_id]
                continue
            state = usable[queue_id].state
            limit = state.domain.max_payload_bytes
            why = columns.check(table.slice(row, 1), limit) if reason or (limits and sizes[row] > limit) else None
            if why:
                refused[row] = (ResultCode.INVALID_ARGUMENT, why)
                continue
            over = state.admit([row_guids[row]], [sizes[row]]) if state.quota is not None else None
            if over is not None:
                refused[row] = over
                continue
            group = groups.get(queue_id)
            if group is None:
                group = groups[queue_id] = (state, [])
            group[1].append(row)
        # Committed queue by queue: each queue's rows keep their order and
        # take consecutive seqs, so the primary decides and pushes them as
        # one run per queue, as a frame of that queue alone. The ACK still
        # names the rows in the frame's order (the header's GUIDs).
        order = [row for _, queue_rows in groups.values() for row in queue_rows]
        if order != list(range(len(ids))):   # (the SDK sends them queue by queue)
            table = table.take(pa.array(order, pa.int64()))
        return ([(state, len(queue_rows)) for state, queue_rows in groups.values()], table,
                sum(sizes[row] for row in order))

    def _broadcast(self, handle: OpenHandle, messages: list[StoredMessage]) -> None:
        """Broadcast mode: no storage, no pipeline. The consumers attached right
        now get them (at-most-once); the PUTs are ACKed once handed to them.
        One route per PUT frame and queue, so each consumer gets one PUSH frame
        for the lot, not one per message."""
        handle.partition.route(handle.state, "",
                               lambda d: [push for m in messages for push in d.broadcast(m)])

    def _on_confirm(self, link: Link, batch: pb.ConfirmBatch) -> None:
        """CONFIRMs one by one (seq, and the GUID checked against it)."""
        seqs: dict[int, list[int]] = {}
        guids: dict[int, list[bytes]] = {}
        for message in batch.messages:
            seqs.setdefault(message.queue_id, []).append(message.sequence)
            guids.setdefault(message.queue_id, []).append(message.guid)
        self._confirm(link, seqs, guids)

    def _on_confirm_columns(self, link: Link, frame: pb.ConfirmColumns) -> None:
        """CONFIRMs as seq ranges (what the SDK sends), of one queue or of
        many: each range as it came, with no list of its seqs made here
        (`Partition.confirm_ranges`)."""
        invalid = seq_ranges.confirm_columns_invalid(frame)
        if invalid:
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, invalid))))
            return
        handles = self._handles_of(link)
        if frame.queue_ids and self._confirm_held(link, frame, handles):
            return
        by_partition: dict[Partition, list[ConfirmRange]] = {}
        if not frame.queue_ids:   # one queue: its ranges as they are
            handle = handles.get(frame.queue_id)
            if _holds_confirms(handle):
                by_partition[handle.partition] = [
                    (handle.state, handle.app, (link, frame.queue_id), frame.starts, frame.counts)]
        else:   # a range or a few of each of many queues: consecutive ranges of one queue make one entry
            last_id, handle, ranges, starts, counts = -1, None, None, None, None
            for queue_id, start, count in zip(frame.queue_ids, frame.starts, frame.counts):
                if queue_id == last_id:
                    if starts is not None and counts is not None:
                        starts.append(start)
                        counts.append(count)
                    continue
                last_id = queue_id
                handle = handles.get(queue_id)
                if not _holds_confirms(handle):
                    starts = counts = None
                    continue
                ranges = by_partition.get(handle.partition)
                if ranges is None:
                    ranges = by_partition[handle.partition] = []
                starts, counts = [start], [count]
                ranges.append((handle.state, handle.app, (link, queue_id), starts, counts))
        for partition, ranges_of in by_partition.items():
            done = partition.confirm_ranges(ranges_of)   # what the room they free lets through goes out together
            if done is not None:
                partition.confirm_committer.submit([done], 0, len(done.confirmed.guids))

    def _confirm_held(self, link: Link, frame: pb.ConfirmColumns, handles: Mapping[int, OpenHandle]) -> bool:
        """A CONFIRM frame spanning queues whose every range names rows its
        partition's ledger holds (each queue id the sole consumer of a plain
        dispatcher, `primary.ledger`), confirmed there as arrays, with no
        entry made a queue. False: nothing done (the frame goes the general way)."""
        handle = handles.get(frame.queue_ids[0])
        if handle is None:
            return False
        partition = handle.partition
        if not partition.ledger.keys:
            return False
        handled, done = partition.confirm_held(link, np.asarray(frame.queue_ids, np.int64),
                                               np.asarray(frame.starts, np.int64), np.asarray(frame.counts, np.int64))
        if not handled:
            return False
        if done is not None:
            partition.confirm_committer.submit([done], 0, len(done.confirmed.guids))
        return True

    def _confirm(self, link: Link, seqs_by_queue: Mapping[int, list[int]],
                 guids_by_queue: Mapping[int, list[bytes]] | None = None) -> None:
        """Confirm each queue's seqs (GUIDs, when given, checked against
        them): one pass over a partition's queues for the whole frame
        (`Partition.confirm`), one submission to its confirm committer."""
        handles = self._handles_of(link)
        by_partition: dict[Partition, list[ConfirmEntry]] = {}
        for queue_id, seqs in seqs_by_queue.items():
            handle = handles.get(queue_id)
            if not _holds_confirms(handle):
                continue
            entries = by_partition.get(handle.partition)
            if entries is None:
                entries = by_partition[handle.partition] = []
            entries.append((handle.state, handle.app, (link, queue_id), seqs,
                            None if guids_by_queue is None else guids_by_queue[queue_id]))
        for partition, entries in by_partition.items():
            done = partition.confirm(entries)   # what the room they free lets through goes out together
            if done is not None:
                partition.confirm_committer.submit([done], 0, len(done.confirmed.guids))

    def _on_stop(self, link: Link, req: pb.StopRequest) -> None:
        # The peer is stopping: send it no new PUSHes, then answer.
        self._pause(link)
        link.send(pb.Frame(stop_response=pb.StopResponse(request_id=req.request_id)))

    def _on_stop_response(self, link: Link, resp: pb.StopResponse) -> None:
        with self._lock:
            self._stopped_links.add(link)

    def _on_heartbeat(self, link: Link, beat: pb.Heartbeat) -> None:
        link.send(pb.Frame(heartbeat=beat))


def _holds_confirms(handle: OpenHandle | None) -> TypeGuard[OpenHandle]:
    """Whether a CONFIRM for this queue id of a link can confirm anything.
    One for a queue the link does not read is dropped: the message stays
    with whoever holds it (at-least-once). Broadcast keeps nothing, so
    there is nothing to confirm."""
    return handle is not None and handle.read and not handle.broadcast


def _not_taken(partition: Partition) -> Refusal:
    """Why a partition's committer did not take PUTs: it is stopping (the
    partition moves to its next primary), or its pending buffer is full."""
    if partition.put_committer.stopping:
        return Refusal(ResultCode.REFUSED, f"partition {partition.index}'s primary is stopping; "
                       "its next primary takes PUTs")
    return Refusal(ResultCode.LIMIT_MESSAGES, "primary's pending PUT buffer is full")


def _runs_if_grouped(ids: list[int], usable: Mapping[int, OpenHandle]) -> list[tuple[QueueState, int]] | None:
    """The runs of a frame spanning queues whose rows come queue by queue
    (as the SDK sends them): each queue's state and its row count; None
    when a queue's rows are not together."""
    runs = id_runs(ids)
    if len(runs) != len(usable):
        return None
    return [(usable[queue_id].state, count) for queue_id, count in runs]
