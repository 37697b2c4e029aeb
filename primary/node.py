"""A cluster node acting as primary for its partitions: frame handling.

Every inbound frame is validated before anything is accepted; bad input gets a
clear status (`INVALID_ARGUMENT`, `REFUSED`, ...) on that request or message
only, and the stream and every other client carry on.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

import conf
from conf import ClusterConfig, DomainConfig
from primary.dispatcher import ConsumerOptions, QueueDispatcher, StoredMessage
from primary.partition import Partition, PendingColumns, PendingConfirm, PendingPut, QueueState, send_acks
from primary.quota import DomainQuota
from protocol import ResultCode, columns, parse_queue_uri, pb, status, wire
from protocol.codes import COMPRESSION_NAMES
from protocol.expression import ExpressionError, compile_expression
from protocol.properties import validate_wire
from protocol.stream import Link
from protocol.limits import CONSUMER_PRIORITY_MAX, GUID_LENGTH
from protocol.uri import QueueUri, partition_of
from replicas.upstream import Upstream
from storage import tables
from storage.lease_machine import Action, LeaseMachine, LeaseState, LeaseView
from storage.leases import Fenced, LeaseTable
from protocol.clock import wall_time_us

log = logging.getLogger(__name__)
DOMAIN_POLL_S = 1.0
PARTITION_READY_WAIT_S = 30.0
COMPRESSIONS = (pb.COMPRESSION_NONE, *COMPRESSION_NAMES)


_QUEUE_FRAMES = frozenset({"put", "put_columns", "confirm", "configure_queue", "close_queue", "stop_request"})


@dataclass
class OpenHandle:
    uri: QueueUri
    read: bool
    write: bool
    state: QueueState
    partition: Partition

    @property
    def app(self) -> str:
        return self.uri.app_id or ""

    @property
    def broadcast(self) -> bool:
        return self.state.domain.mode == "broadcast"


def consumer_options(options: pb.QueueOptions | None, defaults: ConsumerOptions) -> ConsumerOptions | str:
    if options is None:
        return defaults
    if options.max_unconfirmed_messages < 0 or options.max_unconfirmed_bytes < 0:
        return "max_unconfirmed_messages and max_unconfirmed_bytes must be >= 0"
    if not -CONSUMER_PRIORITY_MAX <= options.consumer_priority <= CONSUMER_PRIORITY_MAX:
        return "consumer_priority must be within [-2^30, 2^30]"
    subscriptions = []
    for text in options.subscriptions:
        try:
            subscriptions.append(compile_expression(text))
        except ExpressionError as exc:
            return f"subscription {text!r}: {exc}"
    return ConsumerOptions(options.max_unconfirmed_messages, options.max_unconfirmed_bytes,
                           options.consumer_priority, tuple(subscriptions))


class Node:
    """A cluster node: primary for the partitions whose lease it holds, and a
    replica for the rest, relaying their queues' traffic to their primary
    (`replicas.upstream.Upstream`, one per partition, with a retransmission
    buffer). A lease keeper thread takes, renews and gives up leases
    (`storage.leases`); a partition whose lease is won is recovered from Delta
    and served; one whose lease is lost stops at once, and the links with
    queues on it are ended so that the hops below resend to the new primary."""

    def __init__(self, config: ClusterConfig, name: str, domains_dir: Path | None = None):
        self.config = config
        self.name = name
        self.address = ""
        self._quotas: dict[str, DomainQuota] = {
            d.name: DomainQuota(d) for d in config.domains.values() if d.has_quota}
        self.partitions: dict[int, Partition] = {}
        self._handles: dict[Link, dict[int, OpenHandle]] = {}
        self._remote: dict[Link, dict[int, Upstream]] = {}   # queues relayed to another primary
        self._lock = threading.Lock()
        self._domains_dir = domains_dir
        self._domain_stamp = conf.domain_files(domains_dir) if domains_dir else {}
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch_domains, name="domain-watcher", daemon=True)
        names = [n.name for n in config.nodes]
        me = names.index(name) if name in names else 0
        ha = config.ha
        self._leases = [LeaseMachine(name, (me - p) % len(names), ha.lease_duration_ms, ha.lease_renew_interval_ms)
                        for p in range(config.partitions)]
        self._lease_tables = [LeaseTable(tables.PartitionPaths(config.data_dir, p).lease)
                              for p in range(config.partitions)]
        self._views: list[LeaseView | None] = [None] * config.partitions
        self._ready = [threading.Event() for _ in range(config.partitions)]
        self._lease_lock = threading.Lock()
        self._keeper = threading.Thread(target=self._keep_leases, name="lease-keeper", daemon=True)
        self._forwarders: dict[int, Upstream] = {}
        self._limits = ha.retransmission
        self._stopped_links: set[Link] = set()              # peers that answered our StopRequest

    def start(self, address: str = "") -> None:
        """Start taking leases. `address` is where this node serves (written
        into the lease so other nodes can relay to it)."""
        self.address = address or self.config.node(self.name).address
        self._keeper.start()
        if self._domains_dir is not None:
            self._watcher.start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every partition has a known primary (this node or another)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ready[p].is_set() or self._leader_addresses(p) for p in range(self.config.partitions)):
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
        self._keeper.join(5)
        for forwarder in list(self._forwarders.values()):
            forwarder.stop()
        with self._lease_lock:
            for p, machine in enumerate(self._leases):
                if machine.stop() is Action.RELEASE:
                    try:
                        self._lease_tables[p].release(machine.epoch, self.name, self.address, wall_time_us())
                    except Exception:
                        log.exception("partition %d: releasing the lease failed; it will lapse instead", p)
        for partition in list(self.partitions.values()):
            partition.stop()
        # End every stream: the peers move to their next host at once.
        with self._lock:
            links = set(self._handles) | set(self._remote)
        for link in links:
            link.close()

    def drain(self) -> None:
        """Graceful stop, BlazingMQ's StopRequest: push nothing new, ask every
        peer below to stop sending PUTs (they keep them in their buffers for
        the next primary), then wait until every PUT received is committed and
        ACKed and every message pushed is confirmed, or `ha.stop_timeout_ms`.
        ACKs and CONFIRMs keep flowing the whole time."""
        deadline = time.monotonic() + self.config.ha.stop_timeout_ms / 1000
        with self._lock:
            links = {link: dict(handles) for link, handles in self._handles.items()}
            links.update({link: {} for link in self._remote if link not in links})
        for link, handles in links.items():
            for queue_id, handle in handles.items():
                if handle.read:
                    handle.partition.route(handle.state, handle.app, functools.partial(
                        QueueDispatcher.configure_consumer, key=(link, queue_id), options=ConsumerOptions(0, 0, 0)))
            link.send(pb.Frame(stop_request=pb.StopRequest(
                request_id=1, timeout_ms=self.config.ha.stop_timeout_ms)))
        for forwarder in list(self._forwarders.values()):
            forwarder.pause_consumers()  # consumers below relayed queues: nothing new either

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
                    and all(f.relay.drained for f in list(self._forwarders.values())))

        for what, done in (("StopResponses", answered), ("ACKs and CONFIRMs", drained)):
            while not done() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not done():
                log.warning("node %s: stop timeout (%d ms) reached waiting for %s; going anyway", self.name,
                            self.config.ha.stop_timeout_ms, what)
                return
        log.info("node %s: drained", self.name)

    def notify_delivery(self, partition: int) -> None:
        led = self.partitions.get(partition)
        if led is not None:
            led.notify_delivery()

    # -- leases -------------------------------------------------------------
    def _keep_leases(self) -> None:
        ha = self.config.ha
        interval_s = min(ha.lease_renew_interval_ms / 2, 100) / 1000
        while not self._stopping.wait(interval_s):
            for p in range(self.config.partitions):
                try:
                    self._keep_lease(p)
                except Exception:
                    log.exception("partition %d: lease keeping failed; retrying", p)

    def _keep_lease(self, p: int) -> None:
        machine, table = self._leases[p], self._lease_tables[p]
        with self._lease_lock:
            if self._stopping.is_set():
                return
            now = time.monotonic() * 1000
            if machine.state is LeaseState.PRIMARY:
                action = machine.tick(now)
                if action is Action.RENEW:
                    late_ms = now - machine.renewed_ms
                    try:
                        ok = table.renew(machine.epoch)
                    except Exception:
                        if not machine.lapsed(now):
                            raise  # logged by the keeper loop, retried on the next tick
                        log.exception("partition %d: lease renewal failed after the lease ran out", p)
                        ok = False
                    action = machine.renewed(ok, now)
                    took_ms = time.monotonic() * 1000 - now
                    if late_ms + took_ms > self.config.ha.lease_duration_ms / 2:
                        # A starved process (CPU) or slow storage. Past the
                        # lease, a follower may take over: then this renewal
                        # fails and the partition steps down.
                        log.warning("partition %d: lease renewal %s %.0f ms after the last one (the commit "
                                    "took %.0f ms; the lease is %d ms)", p, "succeeded" if ok else "refused",
                                    late_ms + took_ms, took_ms, self.config.ha.lease_duration_ms)
            elif machine.state is LeaseState.FOLLOWER:
                view = self._views[p] = table.read()
                action = machine.observed(view, now)
                if action is Action.ACQUIRE:
                    epoch = machine.next_epoch()
                    won = table.acquire(epoch, self.name, self.address, wall_time_us(),
                                        expected_version=None if view is None else view.version)
                    action = machine.acquired(epoch if won else None, now)
                    self._views[p] = table.read()
            else:
                return
        if action is Action.BECOME_PRIMARY:
            threading.Thread(target=self._become_primary, args=(p, machine.epoch, now), daemon=True,
                             name=f"take-{p}").start()
        elif action is Action.STEP_DOWN:
            self._step_down(p, "lease lapsed or taken over")

    def _become_primary(self, p: int, epoch: int, since_ms: float) -> None:
        log.info("partition %d: lease epoch %d taken; fencing and recovering", p, epoch)
        try:
            partition = Partition(p, self.config, epoch=epoch, quota_for=self._quotas.get,
                                  on_fenced=functools.partial(self._fenced, p))
            partition.start()
        except Fenced as exc:
            log.warning("partition %d: a newer primary exists: %s", p, exc)
            self._fenced(p)
            return
        except Exception:
            log.exception("partition %d: could not start as primary; giving the lease up", p)
            self._fenced(p)
            return
        with self._lease_lock:
            current = self._leases[p].state is LeaseState.PRIMARY and self._leases[p].epoch == epoch
        if not current or self._stopping.is_set():
            partition.stop()
            return
        self.partitions[p] = partition
        self._ready[p].set()
        seconds = (time.monotonic() * 1000 - since_ms) / 1000
        log.info("partition %d: serving as primary, epoch %d (%.2f s after taking the lease)", p, epoch, seconds)

    def _fenced(self, p: int) -> None:
        with self._lease_lock:
            action = self._leases[p].fenced()
        if action is Action.STEP_DOWN or p in self.partitions:
            self._step_down(p, "fenced by a newer primary")

    def _step_down(self, p: int, why: str) -> None:
        self._ready[p].clear()
        partition = self.partitions.pop(p, None)
        log.warning("partition %d: stepping down (%s)", p, why)
        if partition is None:
            return
        # End every link with queues here: the hops below keep their PUTs and
        # reopen through whichever node they reach next.
        with self._lock:
            doomed = [link for link, handles in self._handles.items()
                      if any(h.partition is partition for h in handles.values())]
        for link in doomed:
            link.close()
        threading.Thread(target=partition.stop, name=f"stop-{p}", daemon=True).start()

    def _leader_addresses(self, p: int) -> list[str]:
        """Where partition p's primary serves, as far as this node knows: []
        while there is none (the relay then waits). Never this node unless it
        is primary, so a relay cannot loop back into itself."""
        view = self._views[p]
        if view is None or not view.epoch or view.released or not view.address:
            return []
        if view.holder == self.name and self._leases[p].state not in (LeaseState.PRIMARY, LeaseState.ACQUIRING):
            return []
        return [view.address]

    def _forwarder(self, p: int) -> Upstream:
        with self._lock:
            forwarder = self._forwarders.get(p)
            if forwarder is None:
                forwarder = self._forwarders[p] = Upstream(functools.partial(self._leader_addresses, p),
                                                           name=f"{self.name}-p{p}", limits=self._limits)
                forwarder.start()
            return forwarder

    def _await_primary(self, p: int) -> None:
        """During a failover the partition may have no primary for a moment
        (its lease released or lapsed, nobody has taken it yet). Wait a little
        for one to appear rather than relay to nowhere (or, if this node is
        about to take it, through itself)."""
        deadline = time.monotonic() + 2 * self.config.ha.lease_duration_ms / 1000
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self._leases[p].state in (LeaseState.PRIMARY, LeaseState.ACQUIRING) or self._leader_addresses(p):
                return
            time.sleep(0.02)

    def _local_partition(self, p: int) -> Partition | None | bool:
        """The partition if this node leads it; None if it is becoming its
        primary but not ready in time; False if another node leads it."""
        if self._leases[p].state not in (LeaseState.PRIMARY, LeaseState.ACQUIRING) and p not in self.partitions:
            return False
        self._ready[p].wait(PARTITION_READY_WAIT_S)
        return self.partitions.get(p)

    # -- configuration reload -------------------------------------------------
    def _watch_domains(self) -> None:
        assert self._domains_dir is not None
        while not self._stopping.wait(DOMAIN_POLL_S):
            stamp = conf.domain_files(self._domains_dir)
            if stamp == self._domain_stamp:
                continue
            self._domain_stamp = stamp
            try:
                self.reload_domains(conf.load_domains(self._domains_dir))
            except conf.ConfigError as exc:
                log.error("domain reload rejected, keeping the previous configuration: %s", exc)

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
        with self._lock:
            self._handles[link] = {}

    def close_link(self, link: Link) -> None:
        with self._lock:
            handles = self._handles.pop(link, {})
            remote = self._remote.pop(link, {})
        for queue_id, handle in handles.items():
            self._detach(link, queue_id, handle)
        for forwarder in set(remote.values()):
            forwarder.close_link(link)

    def _detach(self, link: Link, queue_id: int, handle: OpenHandle) -> None:
        with handle.partition.lock:
            handle.state.consumers -= handle.read
            handle.state.producers -= handle.write
        if handle.read:
            handle.partition.route(handle.state, handle.app, lambda d: d.remove_consumer((link, queue_id)))

    # -- frames -------------------------------------------------------------
    def on_frame(self, link: Link, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        remote = self._remote.get(link)
        if remote and kind in _QUEUE_FRAMES:
            local = self._forward(link, kind, frame, remote)
            if local is None:
                return
            frame = local
        handler = {
            "open_queue": self._on_open,
            "configure_queue": self._on_configure,
            "close_queue": self._on_close,
            "put": self._on_put,
            "put_columns": self._on_put_columns,
            "confirm": self._on_confirm,
            "stop_request": self._on_stop,
            "stop_response": self._on_stop_response,
            "heartbeat": self._on_heartbeat,
        }.get(kind or "")
        if handler is None:
            reason = "empty frame" if kind is None else f"a {kind} frame is not valid from a client"
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, reason))))
            return
        handler(link, getattr(frame, kind))

    def _forward(self, link: Link, kind: str, frame: pb.Frame, remote: dict[int, Upstream]) -> pb.Frame | None:
        """Send the part of `frame` that concerns queues relayed to another
        primary through their forwarders; return what is left for this node."""
        if kind in ("put", "confirm"):
            batch = getattr(frame, kind)
            if not any(m.queue_id in remote for m in batch.messages):
                return frame
            by_forwarder: dict[Upstream, list] = {}
            local = []
            for message in batch.messages:
                forwarder = remote.get(message.queue_id)
                if forwarder is None:
                    local.append(message)
                else:
                    by_forwarder.setdefault(forwarder, []).append(message)
            frame_type = pb.PutBatch if kind == "put" else pb.ConfirmBatch
            for forwarder, messages in by_forwarder.items():
                forwarder.on_frame(link, pb.Frame(**{kind: frame_type(messages=messages)}))
            return pb.Frame(**{kind: frame_type(messages=local)}) if local else None
        if kind == "stop_request":
            for forwarder in set(remote.values()):
                forwarder.on_frame(link, frame)
            return frame
        body = getattr(frame, kind)
        forwarder = remote.pop(body.queue_id, None) if kind == "close_queue" else remote.get(body.queue_id)
        if forwarder is None:
            return frame
        forwarder.on_frame(link, frame)
        return None

    def _handles_of(self, link: Link) -> dict[int, OpenHandle]:
        with self._lock:
            return self._handles.get(link, {})

    def _on_open(self, link: Link, req: pb.OpenQueue) -> None:
        domain: DomainConfig | None = None

        def reply(code: ResultCode, message: str = "", max_payload: int = 0,
                  effective: ConsumerOptions | None = None) -> None:
            response = pb.OpenQueueResponse(request_id=req.request_id, queue_id=req.queue_id,
                                            status=status(code, message), max_payload_bytes=max_payload,
                                            dedup_history_window_ms=domain.dedup_history_window_ms
                                            if domain is not None else 0)
            if effective is not None:
                response.options.CopyFrom(pb.QueueOptions(
                    max_unconfirmed_messages=effective.max_unconfirmed_messages,
                    max_unconfirmed_bytes=effective.max_unconfirmed_bytes,
                    consumer_priority=effective.priority,
                    subscriptions=[s.text for s in effective.subscriptions]))
            link.send(pb.Frame(open_queue_response=response))

        uri = parse_queue_uri(req.uri)
        if isinstance(uri, str):
            return reply(ResultCode.INVALID_ARGUMENT, uri)
        domain = self.config.domains.get(uri.domain)
        if domain is None:
            return reply(ResultCode.REFUSED, f"unknown domain {uri.domain!r}")
        if not (req.read or req.write):
            return reply(ResultCode.INVALID_ARGUMENT, "open for read, write or both")
        if uri.app_id and domain.mode != "fanout":
            return reply(ResultCode.INVALID_ARGUMENT,
                         f"?id= is only for fanout domains; {uri.domain!r} is {domain.mode}")
        if domain.mode == "fanout":
            if req.write and uri.app_id:
                return reply(ResultCode.INVALID_ARGUMENT, "producers open a fanout queue without ?id=")
            if req.read and not uri.app_id:
                return reply(ResultCode.INVALID_ARGUMENT, f"consumers of fanout domain {uri.domain!r} open "
                             f"taproot://{uri.domain}/{uri.queue}?id=<app>; apps: {', '.join(domain.app_ids)}")
            if req.read and uri.app_id not in domain.app_ids:
                return reply(ResultCode.REFUSED, f"unknown app id {uri.app_id!r}; domain {uri.domain!r} has "
                             f"apps {', '.join(domain.app_ids)}")
        defaults = ConsumerOptions(domain.max_unconfirmed_messages_default,
                                   domain.max_unconfirmed_bytes_default, 0)
        options = consumer_options(req.options if req.HasField("options") else None, defaults)
        if isinstance(options, str):
            return reply(ResultCode.INVALID_ARGUMENT, options)
        handles = self._handles_of(link)
        if req.queue_id in handles or req.queue_id in self._remote.get(link, {}):
            return reply(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is already open on this session")
        index = partition_of(uri, self.config.partitions)
        self._await_primary(index)
        partition = self._local_partition(index)
        if partition is False:
            # Another node is this partition's primary: relay the queue there.
            forwarder = self._forwarder(index)
            with self._lock:
                self._remote.setdefault(link, {})[req.queue_id] = forwarder
            forwarder.on_frame(link, pb.Frame(open_queue=req))
            return
        if partition is None or partition is True:
            return reply(ResultCode.NOT_READY, f"partition {index} has no primary yet (failover in progress)")
        state = partition.queue_state(uri, domain)
        with partition.lock:
            for wanted, count, limit, what in ((req.read, state.consumers, domain.max_consumers, "consumers"),
                                               (req.write, state.producers, domain.max_producers, "producers")):
                if wanted and limit and count >= limit:
                    return reply(ResultCode.REFUSED, f"queue {state.uri} has {count} {what}; domain "
                                 f"{domain.name!r} allows at most {limit} (max_{what})")
            state.consumers += req.read
            state.producers += req.write
        handle = OpenHandle(uri, req.read, req.write, state, partition)
        handles[req.queue_id] = handle
        reply(ResultCode.SUCCESS, max_payload=domain.max_payload_bytes, effective=options if req.read else None)
        if req.read:
            partition.route(state, handle.app, lambda d: d.add_consumer((link, req.queue_id), options))

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
        reply(ResultCode.SUCCESS)
        handle.partition.route(handle.state, handle.app,
                               lambda d: d.configure_consumer((link, req.queue_id), options))

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
        broadcasts: dict[int, tuple[OpenHandle, list[StoredMessage]]] = {}
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
            elif message.compression not in COMPRESSIONS:
                reason = (ResultCode.INVALID_ARGUMENT, f"unknown compression {message.compression}")
            else:
                prop_reason = validate_wire(message.properties)
                if prop_reason:
                    reason = (ResultCode.INVALID_ARGUMENT, prop_reason)
                elif handle.broadcast:
                    broadcasts.setdefault(message.queue_id, (handle, []))[1].append(StoredMessage(
                        guid=message.guid, seq=0, payload=message.payload, properties=list(message.properties),
                        put_time_us=message.put_time_us, delivery_count=1, compression=message.compression))
                    nacks.append((link, pb.AckMessage(queue_id=message.queue_id, guid=message.guid,
                                                      code=wire(ResultCode.SUCCESS))))
                    continue
                elif handle.state.quota is not None:
                    reason = handle.state.quota.admit(handle.state.uri.queue, message.guid, len(message.payload))
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
                for i in items:
                    if i.queue.quota is not None:
                        i.queue.quota.unadmit(i.message.guid)
                nacks.extend((i.link, pb.AckMessage(
                    queue_id=i.queue_id, guid=i.message.guid, code=wire(ResultCode.LIMIT_MESSAGES),
                    message="primary's pending PUT buffer is full")) for i in items)
        for handle, messages in broadcasts.values():
            self._broadcast(handle, messages)  # handed to the consumers before the ACKs go
        if nacks:
            send_acks(nacks)

    def _on_put_columns(self, link: Link, req: pb.PutColumns) -> None:
        """A columnar batch of PUTs to one queue: checked as a whole (the same
        rules as single PUTs, vectorised), committed as a whole, ACKed as a whole."""
        table = columns.decode(req.arrow_ipc)
        if isinstance(table, str):
            link.send(pb.Frame(error=pb.FrameError(status=status(ResultCode.INVALID_ARGUMENT, table))))
            return
        guids = columns.guids_of(table)

        def nack(code: ResultCode, text: str) -> None:
            link.send(pb.Frame(ack_columns=pb.AckColumns(queue_id=req.queue_id, guids=guids, code=wire(code),
                                                         message=text)))

        handle = self._handles_of(link).get(req.queue_id)
        if handle is None:
            return nack(ResultCode.INVALID_ARGUMENT, f"queue id {req.queue_id} is not open")
        if not handle.write:
            return nack(ResultCode.REFUSED, "queue is not open for writing")
        if handle.broadcast:
            return nack(ResultCode.NOT_SUPPORTED, "columnar PUTs are for stored queues, not broadcast")
        reason = columns.check(table, handle.state.domain.max_payload_bytes)
        if reason:
            return nack(ResultCode.INVALID_ARGUMENT, reason)
        quota = handle.state.quota
        if quota is not None:
            admitted: list[bytes] = []
            for guid, size in zip(table["guid"].to_pylist(), pc.binary_length(table["payload"]).to_pylist()):
                refused = quota.admit(handle.state.uri.queue, guid, size)
                if refused is not None:
                    for g in admitted:
                        quota.unadmit(g)
                    return nack(*refused)
                admitted.append(guid)
        nbytes = pc.sum(pc.binary_length(table["payload"])).as_py()
        item = PendingColumns(link, req.queue_id, handle.state, table, guids)
        if not handle.partition.put_committer.submit([item], nbytes):
            if quota is not None:
                for g in table["guid"].to_pylist():
                    quota.unadmit(g)
            nack(ResultCode.LIMIT_MESSAGES, "primary's pending PUT buffer is full")

    def _broadcast(self, handle: OpenHandle, messages: list[StoredMessage]) -> None:
        """Broadcast mode: no storage, no pipeline. The consumers attached right
        now get them (at-most-once); the PUTs are ACKed once handed to them.
        One route per PUT frame and queue, so each consumer gets one PUSH frame
        for the lot, not one per message."""
        handle.partition.route(handle.state, "",
                               lambda d: [push for m in messages for push in d.broadcast(m)])

    def _on_confirm(self, link: Link, batch: pb.ConfirmBatch) -> None:
        handles = self._handles_of(link)
        by_queue: dict[int, list[bytes]] = {}
        for message in batch.messages:
            handle = handles.get(message.queue_id)
            if handle is None or not handle.read or handle.broadcast:
                # A confirm for a queue this link does not read is dropped: the
                # message stays with whoever holds it (at-least-once). Broadcast
                # keeps nothing, so there is nothing to confirm.
                continue
            by_queue.setdefault(message.queue_id, []).append(message.guid)
        for queue_id, guids in by_queue.items():
            handle = handles[queue_id]
            state, app = handle.state, handle.app
            confirms: list[PendingConfirm] = []

            def confirm_all(d, guids=guids, queue_id=queue_id, state=state, app=app, confirms=confirms):
                pushes = []
                for guid in guids:
                    stored, more = d.confirm((link, queue_id), guid)
                    pushes.extend(more)
                    if stored is not None:
                        confirms.append(PendingConfirm(state, app, stored))
                        if state.quota is not None:
                            state.quota.app_done(guid, app)
                return pushes

            handle.partition.route(state, app, confirm_all)
            if confirms:
                handle.partition.confirm_committer.submit(confirms, 0)

    def _on_stop(self, link: Link, req: pb.StopRequest) -> None:
        # The peer is stopping: send it no new PUSHes (its consumers pause and
        # keep what they hold until they confirm or the link closes), then answer.
        for queue_id, handle in list(self._handles_of(link).items()):
            if handle.read:
                handle.partition.route(handle.state, handle.app, functools.partial(
                    QueueDispatcher.configure_consumer, key=(link, queue_id), options=ConsumerOptions(0, 0, 0)))
        link.send(pb.Frame(stop_response=pb.StopResponse(request_id=req.request_id)))

    def _on_stop_response(self, link: Link, resp: pb.StopResponse) -> None:
        with self._lock:
            self._stopped_links.add(link)

    def _on_heartbeat(self, link: Link, beat: pb.Heartbeat) -> None:
        link.send(pb.Frame(heartbeat=beat))
