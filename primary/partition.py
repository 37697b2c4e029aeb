"""One storage partition on its primary: the PUT and confirm logs (delta-rs
writers), the queues mapped to it, and the tail of its delivery log.

Threads: one group-commit thread for PUTs, one for CONFIRMs, one tailer for
the delivery log, and one compactor per owned table (`maintenance.py`). Routing state (`QueueState.dispatcher`) is guarded by
`Partition.lock`; links are only ever written through `Link.send`, which is
thread safe.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from conf import ClusterConfig, DomainConfig
from primary.dispatcher import QueueDispatcher, StoredMessage
from primary.group_commit import GroupCommitter, GroupPolicy
from primary.maintenance import Compactor
from primary.quota import DomainQuota
from protocol import ResultCode, pb, wire
from protocol.codes import COMPRESSION_CODES, COMPRESSION_NAMES
from protocol.properties import wire_to_maps
from protocol.uri import QueueUri
from storage import deltars, tables
from storage.leases import Fenced
from taproot.clock import wall_time_us

if TYPE_CHECKING:
    from primary.links import Link

log = logging.getLogger(__name__)
PUSH_FRAME_MESSAGES_MAX = 1000
TTL_SWEEP_INTERVAL_S = 0.5
ROUTE_CHUNK_ROWS = 20_000  # delivery rows routed per hold of the partition lock


@dataclass(eq=False)  # identity: used as a dict key
class QueueState:
    """One queue on its primary: a dispatcher per app ("" outside fanout), the
    open handle counts for max_consumers / max_producers, and the domain's quota."""
    uri: QueueUri
    domain: DomainConfig
    quota: DomainQuota | None = None
    dispatchers: dict[str, QueueDispatcher] = field(default_factory=dict)
    consumers: int = 0
    producers: int = 0

    def dispatcher(self, app: str = "") -> QueueDispatcher:
        d = self.dispatchers.get(app)
        if d is None:
            d = self.dispatchers[app] = QueueDispatcher(
                max_delivery_attempts=self.domain.max_delivery_attempts, clock=wall_time_us)
        return d

    def set_domain(self, domain: DomainConfig, quota: DomainQuota | None) -> None:
        self.domain, self.quota = domain, quota
        for d in self.dispatchers.values():
            d.max_delivery_attempts = domain.max_delivery_attempts


@dataclass
class PendingPut:
    link: "Link"
    queue_id: int
    queue: QueueState
    message: pb.PutMessage


@dataclass
class PendingColumns:
    """A checked columnar batch of PUTs to one queue (`PutColumns`)."""
    link: "Link"
    queue_id: int
    queue: QueueState
    table: pa.Table
    guids: bytes


@dataclass
class PendingConfirm:
    queue: QueueState
    app_id: str
    message: StoredMessage


@dataclass
class DeadLetter:
    queue: QueueState
    app_id: str
    message: StoredMessage
    reason: str
    detail: str


def send_pushes(pushes: list, frame_messages_max: int = PUSH_FRAME_MESSAGES_MAX) -> None:
    """Send dispatcher output ((link, queue_id), message) as PushBatch frames, one
    or more per link, in order. Consecutive pushes of one message (same GUID and
    delivery count) to several queues of one link travel as one PushMessage with
    `queue_ids`: fanout apps and broadcast consumers below a proxy or replica
    cost one copy on that link, not one per consumer."""
    by_link: dict["Link", list[pb.PushMessage]] = {}
    for (link, queue_id), message in pushes:
        messages = by_link.setdefault(link, [])
        if messages:
            last = messages[-1]
            if last.guid == message.guid and last.delivery_count == message.delivery_count:
                if not last.queue_ids:
                    last.queue_ids.append(last.queue_id)
                last.queue_ids.append(queue_id)
                continue
        messages.append(pb.PushMessage(
            queue_id=queue_id, guid=message.guid, payload=message.payload,
            properties=message.properties, put_time_us=message.put_time_us,
            delivery_count=message.delivery_count, sequence=message.seq, compression=message.compression))
    for link, messages in by_link.items():
        for start in range(0, len(messages), frame_messages_max):
            link.send(pb.Frame(push=pb.PushBatch(messages=messages[start:start + frame_messages_max])))


def send_acks(acks: list[tuple["Link", pb.AckMessage]]) -> None:
    by_link: dict["Link", list[pb.AckMessage]] = {}
    for link, ack in acks:
        by_link.setdefault(link, []).append(ack)
    for link, messages in by_link.items():
        link.send(pb.Frame(ack=pb.AckBatch(messages=messages)))


class Partition:
    def __init__(self, index: int, config: ClusterConfig, epoch: int = 1,
                 quota_for: Callable[[str], DomainQuota | None] = lambda _: None,
                 on_fenced: Callable[[], None] = lambda: None):
        self.index = index
        self.config = config
        self.paths = tables.PartitionPaths(config.data_dir, index)
        self.epoch = epoch
        self.lock = threading.RLock()
        self.queues: dict[tuple[str, str], QueueState] = {}
        self.quota_for = quota_for
        self._wake = threading.Event()
        self._stopping = threading.Event()
        # Each appender first claims its table for this epoch (raises `Fenced`
        # if a newer primary already has), and every commit carries the epoch.
        self.on_fenced = on_fenced
        self._puts = deltars.Appender(self.paths.puts, tables.PUTS_SCHEMA, epoch=epoch)
        self._confirms = deltars.Appender(self.paths.confirms, tables.CONFIRMS_SCHEMA, epoch=epoch)
        self._dead = deltars.Appender(self.paths.dead_letters, tables.DEAD_LETTERS_SCHEMA, epoch=epoch)
        self._next_seq = self._max_column("seq") + 1
        # put_time never goes backwards within a partition: the pipeline uses it
        # as its watermark, and a row older than the watermark would be dropped.
        self._last_put_us = self._max_column("put_time")
        self._delivery_version = -1
        self._delivery_table: DeltaTable | None = None  # opened once the pipeline creates it
        policy = GroupPolicy(config.primary.group_commit_max_messages,
                             config.primary.group_commit_max_bytes,
                             config.primary.group_commit_linger_ms)
        self.put_committer: GroupCommitter[PendingPut | PendingColumns] = GroupCommitter(
            f"puts-{index}", self._commit_puts, policy, config.primary.pending_puts_max)
        self.confirm_committer: GroupCommitter[PendingConfirm] = GroupCommitter(
            f"confirms-{index}", self._commit_confirms, policy, 10_000_000)
        self.dead_committer: GroupCommitter[DeadLetter] = GroupCommitter(
            f"dead-{index}", self._commit_dead, policy, 10_000_000)
        self._tailer = threading.Thread(target=self._tail_delivery, name=f"tail-{index}", daemon=True)
        every, target = config.primary.compact_every_commits, config.primary.compact_target_file_bytes
        self.compactors = (Compactor(self.paths.puts, every, f"puts-{index}", target),
                           Compactor(self.paths.confirms, every, f"confirms-{index}", target))
        self.on_pushes: Callable[[list], None] = send_pushes

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> None:
        self._recover()
        self.put_committer.start()
        self.confirm_committer.start()
        self.dead_committer.start()
        self._tailer.start()
        for compactor in self.compactors:
            compactor.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.put_committer.stop()
        self.confirm_committer.stop()
        self.dead_committer.stop()
        self._tailer.join(10)
        for compactor in self.compactors:
            compactor.stop()

    def notify_delivery(self) -> None:
        self._wake.set()

    def queue_state(self, uri: QueueUri, domain: DomainConfig) -> QueueState:
        key = (uri.domain, uri.queue)
        with self.lock:
            state = self.queues.get(key)
            if state is None:
                state = self.queues[key] = QueueState(QueueUri(uri.domain, uri.queue), domain,
                                                      self.quota_for(uri.domain))
            return state

    def route(self, state: QueueState, app: str, action: Callable[[QueueDispatcher], list],
              send: bool = True) -> list:
        """Run `action` on the app's dispatcher under the lock, then send its
        pushes (or return them, with `send=False`) and dead-letter whatever it
        dropped."""
        with self.lock:
            dispatcher = state.dispatcher(app)
            pushes = action(dispatcher)
            dropped = dispatcher.take_dropped()
        if send:
            self.on_pushes(pushes)
        if dropped:
            self._dead_letter(state, app, dropped)
        return [] if send else pushes

    def _dead_letter(self, state: QueueState, app: str, dropped: list) -> None:
        for message, reason, detail in dropped:
            log.warning("partition %d: taproot://%s/%s%s: message seq %d removed from delivery: %s (%s)",
                        self.index, state.uri.domain, state.uri.queue, f"?id={app}" if app else "",
                        message.seq, reason, detail)
            if state.quota is not None:
                state.quota.app_done(message.guid, app)
        self.dead_committer.submit([DeadLetter(state, app, m, r, d) for m, r, d in dropped], 0)

    def expire(self) -> None:
        """TTL sweep of every queue whose domain has one."""
        with self.lock:
            targets = [(s, app) for s in self.queues.values() if s.domain.message_ttl_ms
                       for app in list(s.dispatchers)]
        for state, app in targets:
            self.route(state, app, _expire)

    def _max_column(self, column: str) -> int:
        return _max_stat(self._puts.table, column)

    def _recover(self) -> None:
        """Rebuild what is unconfirmed: every (delivery row, app) with no confirm
        and no dead letter. PUTs not yet delivered count against quotas."""
        done: set[tuple[bytes, str]] = set()
        for table in (self._confirms.table, self._dead.table):
            rows = table.to_pyarrow_table(columns=["guid", "app_id"])
            done.update(zip(rows["guid"].to_pylist(), rows["app_id"].to_pylist()))
        self._catch_up(skip=done)
        self._recover_undelivered_quota()
        log.info("partition %d recovered: next seq %d, delivery version %d, %d confirms and dead letters",
                 self.index, self._next_seq, self._delivery_version, len(done))

    def _recover_undelivered_quota(self) -> None:
        quotas = {name: self.quota_for(name) for name in self.config.domains}
        if not any(quotas.values()):
            return
        last_delivered = -1 if self._delivery_table is None else _max_stat(self._delivery_table, "seq")
        rows = self._puts.table.to_pyarrow_table(
            columns=["domain", "queue", "guid", "payload"], filters=[("seq", ">", last_delivered)])
        for domain, queue, guid, payload in zip(*(rows[c].to_pylist() for c in ("domain", "queue", "guid",
                                                                                  "payload"))):
            quota = quotas.get(domain)
            if quota is not None:
                quota.admit(queue, guid, len(payload))

    # -- PUT path -----------------------------------------------------------
    def _commit_puts(self, items: list) -> None:
        """One Delta commit for every PUT of the group (single PUTs and columnar
        batches alike), then the ACKs."""
        build_started = time.perf_counter()
        now_us = self._last_put_us = max(wall_time_us(), self._last_put_us)
        singles = [i for i in items if isinstance(i, PendingPut)]
        bulks = [i for i in items if isinstance(i, PendingColumns)]
        parts = []
        if singles:
            props = [wire_to_maps(i.message.properties) for i in singles]
            parts.append(self._rows(
                [i.queue for i in singles], pa.array([i.message.guid for i in singles], pa.binary()),
                pa.array([i.message.payload for i in singles], pa.binary()),
                pa.array([p[0] for p in props], tables.PROPERTY_MAP), pa.array([p[1] for p in props], tables.PROPERTY_MAP),
                pa.array([i.message.put_time_us or None for i in singles], pa.int64()),
                pa.array([COMPRESSION_NAMES.get(i.message.compression) for i in singles], pa.string()), now_us))
        for bulk in bulks:
            t = bulk.table
            parts.append(self._rows([bulk.queue] * t.num_rows, t["guid"], t["payload"], t["properties"],
                                    t["property_types"], pa.nulls(t.num_rows, pa.int64()), t["compression"], now_us))
        batch = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        count = batch.num_rows
        code, text = ResultCode.SUCCESS, ""
        started = time.perf_counter()
        try:
            self._puts.append(batch)
            self.compactors[0].on_commit()
        except Fenced as exc:
            # A newer primary has the partition: nothing was written. No ACK:
            # the node ends these links and the hops below resend the PUTs to
            # the new primary from their retransmission buffers.
            log.warning("partition %d: fenced, %d PUTs left to the new primary: %s", self.index, count, exc)
            self.on_fenced()
            return
        except Exception as exc:
            log.exception("partition %d: PUT commit of %d messages failed", self.index, count)
            code, text = ResultCode.STORAGE_FAILURE, f"Delta commit failed: {exc}"
            for i in singles:
                if i.queue.quota is not None:
                    i.queue.quota.unadmit(i.message.guid)
            for b in bulks:
                if b.queue.quota is not None:
                    for guid in b.table["guid"].to_pylist():
                        b.queue.quota.unadmit(guid)
        send_acks([(i.link, pb.AckMessage(queue_id=i.queue_id, guid=i.message.guid, code=wire(code),
                                          message=text)) for i in singles])
        for b in bulks:
            b.link.send(pb.Frame(ack_columns=pb.AckColumns(queue_id=b.queue_id, guids=b.guids, code=wire(code),
                                                           message=text)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("partition %d: %d PUTs: commit and ACK %.1f ms (build %.1f ms)", self.index, count,
                      (time.perf_counter() - started) * 1000, (started - build_started) * 1000)

    def _rows(self, queues: list[QueueState], guid, payload, properties, property_types, producer_us,
              compression, now_us: int) -> pa.Table:
        """PUT-log rows, numbered from the partition's next sequence number."""
        count = len(queues)
        first_seq = self._next_seq
        self._next_seq += count
        return pa.table({
            "domain": pa.array([q.uri.domain for q in queues], pa.string()),
            "queue": pa.array([q.uri.queue for q in queues], pa.string()),
            "guid": guid,
            "seq": pa.array(range(first_seq, first_seq + count), pa.int64()),
            "payload": payload,
            "properties": properties,
            "property_types": property_types,
            "producer_time": producer_us.cast(tables.TIMESTAMP),
            "put_time": pa.array([now_us] * count, pa.int64()).cast(tables.TIMESTAMP),
            "epoch": pa.array([self.epoch] * count, pa.int64()),
            "compression": compression,
        }, schema=tables.PUTS_SCHEMA)

    def _commit_confirms(self, items: list[PendingConfirm]) -> None:
        now = datetime.now(timezone.utc)
        batch = pa.table({
            **_message_columns(items),
            "confirm_time": pa.array([now] * len(items), tables.TIMESTAMP),
        }, schema=tables.CONFIRMS_SCHEMA)
        try:
            self._confirms.append(batch)
            self.compactors[1].on_commit()
        except Fenced:
            self.on_fenced()  # the new primary delivers these messages again
        except Exception:
            # Not fatal for correctness: an unpersisted confirm means the message
            # is delivered again after a restart (at-least-once).
            log.exception("partition %d: CONFIRM commit of %d rows failed", self.index, len(items))

    def _commit_dead(self, items: list[DeadLetter]) -> None:
        now = datetime.now(timezone.utc)
        props = [(i.message.properties and wire_to_maps(i.message.properties)) or ([], []) for i in items]
        batch = pa.table({
            **_message_columns(items),
            "payload": pa.array([i.message.payload for i in items], pa.binary()),
            "properties": pa.array([p[0] for p in props], tables.PROPERTY_MAP),
            "property_types": pa.array([p[1] for p in props], tables.PROPERTY_MAP),
            "compression": pa.array([COMPRESSION_NAMES.get(i.message.compression) for i in items], pa.string()),
            "producer_time": pa.array([i.message.put_time_us or None for i in items], pa.int64())
            .cast(tables.TIMESTAMP),
            "delivery_count": pa.array([i.message.delivery_count for i in items], pa.int64()),
            "reason": pa.array([i.reason for i in items], pa.string()),
            "detail": pa.array([i.detail for i in items], pa.string()),
            "dead_time": pa.array([now] * len(items), tables.TIMESTAMP),
        }, schema=tables.DEAD_LETTERS_SCHEMA)
        try:
            self._dead.append(batch)
        except Fenced:
            self.on_fenced()
        except Exception:
            # Like a lost confirm: after a restart the message is delivered again.
            log.exception("partition %d: dead-letter commit of %d rows failed", self.index, len(items))

    # -- delivery path ------------------------------------------------------
    def _tail_delivery(self) -> None:
        interval_s = self.config.primary.delivery_poll_interval_ms / 1000
        next_sweep = 0.0
        while not self._stopping.is_set():
            self._wake.wait(interval_s)
            self._wake.clear()
            try:
                self._catch_up()
                # The TTL sweep looks at every queue: not on every poll (at
                # 10,000 queues it was 6% of a node's Python time). Dispatch
                # checks TTL itself, so this only records what sits unpushed.
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + TTL_SWEEP_INTERVAL_S
                    self.expire()
            except Exception:
                log.exception("partition %d: reading the delivery log failed; retrying", self.index)

    def _catch_up(self, skip: set[tuple[bytes, str]] | None = None) -> None:
        # One handle for the life of the partition: read_since refreshes it
        # incrementally (~1 ms when nothing changed); reopening would replay
        # the whole log on every poll.
        if self._delivery_table is None:
            self._delivery_table = deltars.try_open(self.paths.delivery)
            if self._delivery_table is None:
                return  # the pipeline has not created it yet
        columns = ["domain", "queue", "guid", "seq", "payload", "properties", "property_types", "producer_time",
                   "put_time", "compression", "apps"]
        if self._delivery_version < 0:
            # First read (recovery): the current snapshot, not the change feed
            # from version 0, whose files retention may have vacuumed.
            latest, rows = deltars.read_snapshot(self._delivery_table, columns)
        else:
            latest, rows = deltars.read_since(self._delivery_table, self._delivery_version, columns=columns)
        if rows.num_rows:
            self._route_delivered(rows.sort_by([("seq", "ascending")]), skip)
        self._delivery_version = latest

    def _route_delivered(self, rows: pa.Table, skip: set[tuple[bytes, str]] | None) -> None:
        """Hand new delivery rows to each target app's dispatcher, in seq order,
        a chunk at a time so a large batch does not hold the lock for long."""
        for start in range(0, rows.num_rows, ROUTE_CHUNK_ROWS):
            self._route_chunk(rows.slice(start, ROUTE_CHUNK_ROWS), skip)

    def _route_chunk(self, rows: pa.Table, skip: set[tuple[bytes, str]] | None) -> None:
        domains, queues, guids, seqs, payloads, values, types, compressions, apps_of = (
            rows[name].to_pylist() for name in ("domain", "queue", "guid", "seq", "payload", "properties",
                                                "property_types", "compression", "apps"))
        producer = rows["producer_time"].cast(pa.int64()).to_pylist()
        put_time = rows["put_time"].cast(pa.int64()).to_pylist()
        by_target: dict[tuple[QueueState, str], list[StoredMessage]] = {}
        key = state = None
        with self.lock:
            for i in range(rows.num_rows):
                if (domains[i], queues[i]) != key:
                    key = (domains[i], queues[i])
                    state = self.queues.get(key)
                    if state is None:
                        domain_config = self.config.domains.get(domains[i])
                        if domain_config is None:
                            log.error("delivery row for unknown domain %r: kept in storage only", domains[i])
                            key = None
                            continue
                        state = self.queue_state(QueueUri(domains[i], queues[i]), domain_config)
                assert state is not None
                guid, apps = guids[i], apps_of[i]
                if apps is None:
                    apps = list(state.domain.apps)  # rows from before fanout existed
                if skip:
                    apps = [a for a in apps if (guid, a) not in skip]
                payload = payloads[i]
                if state.quota is not None:
                    state.quota.delivered(queues[i], guid, len(payload), set(apps))
                if not apps:
                    continue
                ttl_ms = state.domain.message_ttl_ms
                base = StoredMessage(guid, seqs[i], payload, None, producer[i] or 0,
                                     expires_us=put_time[i] + ttl_ms * 1000 if ttl_ms else 0,
                                     compression=COMPRESSION_CODES.get(compressions[i] or "", 0),
                                     maps=(values[i], types[i]) if values[i] else None)
                for n, app in enumerate(apps):
                    by_target.setdefault((state, app), []).append(base if n == 0 else base.for_app())
        # Route every app, then send the pushes together, merged by sequence
        # number (each app's own order kept): a message going to several apps
        # below one link then goes down that link once (`send_pushes`).
        routed = [self.route(state, app, functools.partial(QueueDispatcher.add_messages, messages=messages),
                             send=False) for (state, app), messages in by_target.items()]
        routed = [pushes for pushes in routed if pushes]
        if len(routed) == 1:
            self.on_pushes(routed[0])
        elif routed:
            # A stable sort of the concatenation is that merge (ties keep the
            # apps' order), in C: heapq.merge over 10,000 queues' lists was 17%
            # of a node's Python time.
            self.on_pushes(sorted(itertools.chain.from_iterable(routed), key=lambda push: push[1].seq))


def _expire(dispatcher: QueueDispatcher) -> list:
    dispatcher.expire()
    return []


def _max_stat(table: DeltaTable, column: str) -> int:
    """Max of an int64/timestamp column from file statistics (no data read); -1 when empty."""
    actions = pa.table(table.get_add_actions(flatten=True))
    name = f"max.{column}"
    if actions.num_rows == 0 or name not in actions.column_names:
        return -1
    values = actions[name]
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    value = pc.max(values).as_py()
    return -1 if value is None else int(value)


def _message_columns(items: list) -> dict[str, pa.Array]:
    """The columns the confirm and dead-letter logs share: which message, for which app."""
    return {
        "domain": pa.array([i.queue.uri.domain for i in items], pa.string()),
        "queue": pa.array([i.queue.uri.queue for i in items], pa.string()),
        "app_id": pa.array([i.app_id for i in items], pa.string()),
        "guid": pa.array([i.message.guid for i in items], pa.binary()),
        "seq": pa.array([i.message.seq for i in items], pa.int64()),
    }
