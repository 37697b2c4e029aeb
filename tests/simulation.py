"""A deterministic simulation of the distribution tree (seeded, injected clock).

    producer ─┐                     (each ─ is a link: frames are delayed a
              ├─ proxy ── replica ── primary (express lane: GUID history, dispatch)
    consumer ─┘                      random time, and a cut loses whatever is
                                     in flight and ends both sides' view of it)

Every decision is made by the real code: the producer and the consumer are the
SDK's `taproot.core.SessionCore`; the two forwarding hops are the real
`replicas.relay.Relay`, the code the proxy and the replicas run; the primary
runs the real admission checks (`primary.admission`), the express lane's GUID
history (`primary.express.GuidHistory`) and the dispatcher with its flow
control and redelivery (`primary.dispatcher.QueueDispatcher`). Only the Delta
commit is modelled: ACK only after the commit; a crash loses what is not
committed, never what is, and recovery rebuilds the history and the
unconfirmed messages from the log. Time is an integer millisecond clock;
nothing sleeps and nothing is random but the seeded generator, so a failing
seed replays exactly.

The invariants (`check_always`, `check_end`) each carry a stable phrase;
`tests/test_simulation.py` shows each one failing on a seeded bug.

Faults: cut any link (the lower side reconnects after a random delay), crash
the primary (it restarts from its committed log with a new epoch). Links do not
drop single frames on a live connection: the real links are gRPC streams over
TCP, where loss ends the stream, which is a cut.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from typing import Callable

from conf import parse_domain
from primary import admission
from primary.dispatcher import ConsumerOptions, QueueDispatcher, StoredMessage
from primary.express import GuidHistory
from protocol import ResultCode, columns, pb, status
from protocol import seqs as seq_ranges
from protocol.retransmit import RetransmissionLimits
from replicas.relay import UPSTREAM, Relay
from taproot.batching import BatchPolicy
from taproot.core import QueueRecord, SessionCore

URI = "taproot://sim/q"


def uri_of(queue_id: int) -> str:
    """Queue 1 is `URI`; with several queues per client, 2, 3, ... follow it."""
    return URI if queue_id == 1 else f"{URI}{queue_id}"


class Link:
    """One connection generation between a lower and an upper endpoint."""
    def __init__(self, sim: "Simulation", name: str, down: "Endpoint", up: "Endpoint"):
        self.sim, self.name, self.down, self.up = sim, name, down, up
        self.id = next(sim.link_ids)
        self.alive = True

    def __repr__(self) -> str:
        return f"{self.name}#{self.id}"

    def send_up(self, frame: pb.Frame) -> None:
        self._send(lambda: self.up.receive_from_below(self, frame))

    def send_down(self, frame: pb.Frame) -> None:
        self._send(lambda: self.down.receive_from_above(self, frame))

    def _send(self, deliver) -> None:
        if not self.alive:
            return
        # In-order per link (a stream): each frame lands after the previous one.
        at = max(self.sim.now + self.sim.rng.randint(0, 15), getattr(self, "_last", 0))
        self._last = at

        def run():
            if self.alive:
                deliver()
        self.sim.schedule(at - self.sim.now, run)

    def cut(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self.sim.log.append(f"{self.sim.now}: cut {self}")
        self.up.below_lost(self)
        self.down.above_lost(self)


class Endpoint:
    def receive_from_below(self, link: Link, frame: pb.Frame) -> None: ...
    def receive_from_above(self, link: Link, frame: pb.Frame) -> None: ...
    def below_lost(self, link: Link) -> None: ...
    def above_lost(self, link: Link) -> None: ...


class Client(Endpoint):
    """The SDK: the real `taproot.core.SessionCore` with `queues` queues; the
    application counts every answer the core gives to each PUT, and a
    consumer confirms what it gets."""

    def __init__(self, sim: "Simulation", name: str, upper: "Endpoint", read: bool, limits: RetransmissionLimits,
                 queues: int = 1):
        self.sim, self.name, self.upper, self.read = sim, name, upper, read
        # A queue's batch of one or two PUTs goes as PutMessages, of more as a frame; with several
        # queues, three or more PUTs of queues with fewer each share a frame: every path.
        self.core = SessionCore(batch=BatchPolicy(linger_ms=2, max_messages=50, columns_min=3, spanning_min=3),
                                limits=limits)
        for qid in range(1, queues + 1):
            self.core.add_queue(QueueRecord(qid, uri_of(qid), read=read, write=not read, open_request=pb.OpenQueue(
                queue_id=qid, uri=uri_of(qid), read=read, write=not read)))
        self.link: Link | None = None
        self.acks: dict[bytes, int] = {}       # GUID -> answers with SUCCESS the application saw
        self.failed: dict[bytes, int] = {}     # GUID -> answers with a failure
        self.answered = 0                       # answers of either kind, counted as they come
        self.delivered: list[bytes] = []
        self.delivered_to: dict[bytes, int] = {}   # GUID -> the queue it was pushed on

    def connect(self) -> None:
        self.link = Link(self.sim, self.name, self, self.upper)
        self.upper.accept(self.link)
        first = self.core.connections == 0
        self.core.connected(self.link.name, self.sim.now)
        if first:
            for qid, q in self.core.queues.items():
                self.core.request(pb.Frame(open_queue=q.open_request), "open_queue", ("open", qid))
        self._carry_out()

    def post(self, guid: bytes, queue_id: int = 1) -> None:
        refused = self.core.post(queue_id, pb.PutMessage(queue_id=queue_id, guid=guid, payload=guid), guid,
                                 self.sim.now)
        if refused is not None:
            self.failed[guid] = self.failed.get(guid, 0) + 1
            self.answered += 1
        self._carry_out()

    def _carry_out(self) -> None:
        effects = self.core.take()
        while effects:
            self._carry_out_once(effects)
            effects = self.core.take()  # what answering these produced (confirms, a resend)

    def _carry_out_once(self, effects) -> None:
        for frame in effects.frames:
            if self.link is not None and self.link.alive:
                self.link.send_up(frame)
        for token, result in effects.answered:
            bucket = self.failed if isinstance(result, Exception) else self.acks
            bucket[token] = bucket.get(token, 0) + 1
            self.answered += 1
        for token, response in effects.responses:
            if isinstance(token, tuple) and token[0] == "open" and not isinstance(response, Exception) \
                    and response.status.code == ResultCode.SUCCESS:
                self.core.opened(token[1], response)
        if effects.pushes:
            by_queue: dict[int, list[int]] = {}
            for m in effects.pushes:
                self.delivered.append(m.guid)
                self.delivered_to[m.guid] = m.queue_id
                by_queue.setdefault(m.queue_id, []).append(m.sequence)
            for qid, seqs in by_queue.items():   # one CONFIRM frame for them all
                self.core.confirm(qid, seqs, self.sim.now)
            self.core.flush()

    def receive_from_above(self, link: Link, frame: pb.Frame) -> None:
        if link is self.link:
            self.core.on_frame(frame)
            self._carry_out()

    def above_lost(self, link: Link) -> None:
        if link is not self.link:
            return
        self.link = None
        self.core.connection_lost("cut")
        self._carry_out()
        self.sim.schedule(self.sim.rng.randint(1, 50), self.connect)

    def tick(self) -> None:
        self.core.tick(self.sim.now)
        self._carry_out()


class Hop(Endpoint):
    """A proxy or replica: the real Relay, with one upstream link at a time."""

    def __init__(self, sim: "Simulation", name: str, upper: "Endpoint", limits: RetransmissionLimits):
        self.sim, self.name, self.upper = sim, name, upper
        self.relay = Relay(limits, connected=False)
        self.up: Link | None = None

    def accept(self, link: Link) -> None:
        """A hop needs nothing set up for a new link below it: the relay keys on the link itself."""

    def connect(self) -> None:
        self.up = Link(self.sim, self.name, self, self.upper)
        self.upper.accept(self.up)
        self._out(self.relay.upstream_restored())

    def _out(self, out) -> None:
        for destination, frame in out:
            if destination == UPSTREAM:
                assert self.up is not None and self.up.alive
                self.up.send_up(frame)
            elif frame is None:
                destination.cut()
            else:
                destination.send_down(frame)

    def receive_from_below(self, link: Link, frame: pb.Frame) -> None:
        self._out(self.relay.from_downstream(link, frame, self.sim.now))

    def receive_from_above(self, link: Link, frame: pb.Frame) -> None:
        self._out(self.relay.from_upstream(frame, self.sim.now))

    def below_lost(self, link: Link) -> None:
        self._out(self.relay.downstream_closed(link))

    def above_lost(self, link: Link) -> None:
        self.up = None
        self._out(self.relay.upstream_lost())
        self.sim.schedule(self.sim.rng.randint(1, 50), self.connect)

    def tick(self) -> None:
        self._out(self.relay.expire(self.sim.now))


class Primary(Endpoint):
    """The primary: the real admission checks, express GUID history and
    dispatcher (`primary.admission`, `primary.express`, `primary.dispatcher`);
    the Delta commits are modelled (a group commit makes PUTs durable, then
    they are ACKed; a crash loses what is not committed, never what is)."""

    def __init__(self, sim: "Simulation", refuse_rows: bool = False):
        self.sim = sim
        self.domains = {"sim": parse_domain("sim", {})}
        # A quota stand-in: with `refuse_rows`, a PUT whose GUID ends in a
        # multiple of 7 is refused on its own (LIMIT_MESSAGES), the rest of
        # its frame stored; always the same GUIDs, whichever frame brings them.
        self.refuse_rows = refuse_rows
        self.refused: set[bytes] = set()
        self.partly_refused = 0                 # frames with some rows refused and some stored
        self.log: list[tuple[bytes, int, str]] = []   # committed PUTs (GUID, commit time, queue URI): durable
        self.spanning_seen: Counter[bytes] = Counter()   # PUT frames spanning queues taken, by their GUIDs
        self.spanning_partly = 0                # of them, refused in part
        self.log_set: set[bytes] = set()
        self.confirmed: set[bytes] = set()      # durable too
        self.epoch = 1
        self.up = True
        self._volatile()

    def _volatile(self) -> None:
        self.links: dict[Link, dict[int, tuple[bool, str]]] = {}   # link -> queue id -> (read, URI)
        # (link, queue id, the frame's GUIDs (None: a single PUT), its PUTs to store with their
        # queue's URI, its rows refused)
        self.uncommitted: list[tuple[Link, int, bytes | None, list[tuple[pb.PutMessage, str]],
                                     dict[int, tuple[ResultCode, str]]]] = []
        self.history = GuidHistory(self.domains["sim"].dedup_history_window_ms * 1000)
        self.dispatchers: dict[str, QueueDispatcher] = {}   # by queue URI (each link names it by its own id)

    def dispatcher(self, uri: str) -> QueueDispatcher:
        found = self.dispatchers.get(uri)
        if found is None:
            found = self.dispatchers[uri] = QueueDispatcher()
        return found

    def accept(self, link: Link) -> None:
        if not self.up:
            self.sim.schedule(0, link.cut)  # nobody listening: the connection fails
            return
        self.links[link] = {}

    def _push(self, pushes) -> None:
        by_link: dict[Link, list[pb.PushMessage]] = {}
        for (link, queue_id), message in pushes:
            by_link.setdefault(link, []).append(pb.PushMessage(
                queue_id=queue_id, guid=message.guid, payload=message.payload,
                delivery_count=message.delivery_count, sequence=message.seq))
        for link, messages in by_link.items():
            link.send_down(pb.Frame(push=pb.PushBatch(messages=messages)))

    def receive_from_below(self, link: Link, frame: pb.Frame) -> None:
        if not self.up or link not in self.links:
            return
        kind = frame.WhichOneof("body")
        queues = self.links[link]
        if kind == "open_queue":
            req = frame.open_queue
            checked = admission.check_open(req, self.domains)
            response = pb.OpenQueueResponse(request_id=req.request_id, queue_id=req.queue_id)
            if isinstance(checked, admission.Refusal):
                response.status.CopyFrom(status(checked.code, checked.message))
                link.send_down(pb.Frame(open_queue_response=response))
                return
            response.dedup_history_window_ms = checked.domain.dedup_history_window_ms
            link.send_down(pb.Frame(open_queue_response=response))
            queues[req.queue_id] = (req.read, req.uri)
            if req.read:
                self._push(self.dispatcher(req.uri).add_consumer((link, req.queue_id), ConsumerOptions(20, 1 << 20)))
        elif kind == "put":
            nacks = []
            for message in frame.put.messages:
                refused = (admission.Refusal(ResultCode.INVALID_ARGUMENT, "queue id not open")
                           if message.queue_id not in queues else admission.check_put(message, self.domains["sim"]))
                if refused is None and self.refuse_rows and message.guid[-1] % 7 == 0:
                    refused = admission.Refusal(ResultCode.LIMIT_MESSAGES, "quota (simulated)")
                    self.refused.add(message.guid)
                if refused is None:
                    self.uncommitted.append((link, message.queue_id, None, [(message, queues[message.queue_id][1])],
                                             {}))
                else:
                    nacks.append(pb.AckMessage(queue_id=message.queue_id, guid=message.guid,
                                               code=refused.code, message=refused.message))
            if nacks:
                link.send_down(pb.Frame(ack=pb.AckBatch(messages=nacks)))
        elif kind == "put_columns":   # a frame: admitted, committed and ACKed as a whole
            req = frame.put_columns
            table = columns.decode(req.arrow_ipc)
            row_queues = list(req.queue_ids) or [req.queue_id] * (0 if isinstance(table, str) else table.num_rows)
            if isinstance(table, str) or any(q not in queues for q in row_queues):
                return   # the SDK and the hops never send one (the node answers with a FrameError)
            if req.queue_ids:
                self.spanning_seen[req.guids] += 1
            guids = columns.guids_of(table)
            refused = columns.check(table, self.domains["sim"].max_payload_bytes)
            if refused is not None:
                link.send_down(pb.Frame(ack_columns=pb.AckColumns(
                    queue_id=req.queue_id, guids=guids, code=ResultCode.INVALID_ARGUMENT, message=refused)))
                return
            rows = list(zip(table["guid"].to_pylist(), table["payload"].to_pylist()))
            refused = {i: (ResultCode.LIMIT_MESSAGES, "quota (simulated)") for i, (g, _) in enumerate(rows)
                       if self.refuse_rows and req.per_message and g[-1] % 7 == 0}
            self.refused.update(rows[i][0] for i in refused)
            if len(refused) == len(rows):
                link.send_down(columns.ack_columns(req.queue_id, guids, ResultCode.SUCCESS, "", refused))
                return
            self.partly_refused += bool(refused)
            self.spanning_partly += bool(refused) and bool(req.queue_ids)
            self.uncommitted.append((link, req.queue_id, guids, [(pb.PutMessage(
                queue_id=row_queues[i], guid=g, payload=p), queues[row_queues[i]][1])
                for i, (g, p) in enumerate(rows) if i not in refused], refused))
        elif kind == "confirm_columns":  # as the node does: the frame's seqs at once
            for queue_id, confirmed_seqs in seq_ranges.confirm_seqs(frame.confirm_columns).items():
                if queue_id not in queues:
                    continue
                stored, more = self.dispatcher(queues[queue_id][1]).confirm_many((link, queue_id), confirmed_seqs)
                self.confirmed.update(stored.guids)
                self._push(more)
        elif kind == "close_queue":
            req = frame.close_queue
            closed = queues.pop(req.queue_id, None)
            if closed:
                self._push(self.dispatcher(closed[1]).remove_consumer((link, req.queue_id)))
            link.send_down(pb.Frame(close_queue_response=pb.CloseQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(ResultCode.SUCCESS))))
        elif kind == "configure_queue":
            req = frame.configure_queue
            link.send_down(pb.Frame(configure_queue_response=pb.ConfigureQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(ResultCode.SUCCESS))))

    def below_lost(self, link: Link) -> None:
        queues = self.links.pop(link, {})
        for queue_id, (read, uri) in queues.items():
            if read:  # its unconfirmed messages go to the next consumer
                self._push(self.dispatcher(uri).remove_consumer((link, queue_id)))

    def tick(self) -> None:
        if not self.up or not self.uncommitted or self.sim.rng.random() >= 0.7:
            return
        # Group commit: everything waiting becomes durable, then it is ACKed,
        # then the express lane decides what to push (duplicates by GUID not).
        groups, self.uncommitted = self.uncommitted, []
        batch = [m for _, _, _, messages, _ in groups for m, _ in messages]
        uris = [uri for _, _, _, messages, _ in groups for _, uri in messages]
        now_us = self.sim.now * 1000
        first_seq = len(self.log)   # a PUT's seq: its place in the log
        self.log.extend((m.guid, now_us, uri) for m, uri in zip(batch, uris))
        self.log_set.update(m.guid for m in batch)
        for link, queue_id, frame_guids, messages, refused in groups:
            if not link.alive:
                continue
            if frame_guids is not None:   # one ACK for the frame, naming the rows refused on their own
                link.send_down(columns.ack_columns(queue_id, frame_guids, ResultCode.SUCCESS, "", refused))
            else:
                link.send_down(pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(
                    queue_id=queue_id, guid=messages[0][0].guid, code=ResultCode.SUCCESS)])))
        duplicates = self.history.commit([m.guid for m in batch], now_us)
        fresh: dict[str, list[StoredMessage]] = {}
        for i, (m, uri, dup) in enumerate(zip(batch, uris, duplicates)):
            if not dup:
                fresh.setdefault(uri, []).append(StoredMessage(m.guid, first_seq + i, m.payload))
        for uri, messages in fresh.items():
            self._push(self.dispatcher(uri).add_messages(messages))

    def crash(self) -> None:
        self.sim.log.append(f"{self.sim.now}: primary crash (epoch {self.epoch})")
        self.up = False
        for link in list(self.links):
            link.cut()
        self._volatile()
        self.sim.schedule(self.sim.rng.randint(20, 200), self.restart)

    def restart(self) -> None:
        self.epoch += 1
        self.up = True
        # Recovery: the GUID history from the log, and what is not confirmed back to delivery.
        seen: set[bytes] = set()
        first = [(seq, g, at, q) for seq, (g, at, q) in enumerate(self.log) if not (g in seen or seen.add(g))]
        self.history.load([(g, at) for _, g, at, _ in first])
        for seq, g, _, q in first:
            if g not in self.confirmed:
                self.dispatcher(q).add_messages([StoredMessage(g, seq, g)])
        self.sim.log.append(f"{self.sim.now}: primary back (epoch {self.epoch})")


class Simulation:
    def __init__(self, seed: int, messages: int = 200, faults: int = 6,
                 limits: RetransmissionLimits | None = None, session_limits: RetransmissionLimits | None = None,
                 refuse_rows: bool = False, queues: int = 1):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.link_ids = itertools.count(1)
        self.log: list[str] = []
        self._events: list[tuple[int, int, Callable[[], None]]] = []   # (at, order, action): a heap
        self._order = itertools.count()
        limits = limits or RetransmissionLimits(timeout_ms=10**9)
        self.primary = Primary(self, refuse_rows)
        self.replica = Hop(self, "replica", self.primary, limits)
        self.proxy = Hop(self, "proxy", self.replica, limits)
        self.producer = Client(self, "producer", self.proxy, read=False, limits=session_limits or limits,
                               queues=queues)
        self.consumer = Client(self, "consumer", self.proxy, read=True, limits=session_limits or limits,
                               queues=queues)
        self.queues = queues
        self.posted_to: dict[bytes, int] = {}    # GUID -> the queue it was posted to
        self.messages = messages
        self.faults = faults
        self.posted: list[bytes] = []

    def schedule(self, delay: int, action) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._order), action))

    def _links(self) -> list[Link]:
        links = [self.producer.link, self.consumer.link, self.proxy.up, self.replica.up]
        return [link for link in links if link is not None and link.alive]

    def _fault(self) -> None:
        choice = self.rng.random()
        if choice < 0.25 and self.primary.up:
            self.primary.crash()
        else:
            links = self._links()
            if links:
                self.rng.choice(links).cut()

    def run(self, horizon_ms: int = 60_000) -> None:
        self.replica.connect()
        self.proxy.connect()
        self.producer.connect()
        self.consumer.connect()
        for i in range(self.messages):
            guid = (self.seed * 1_000_003 + i).to_bytes(16, "big")
            self.posted.append(guid)
            self.posted_to[guid] = 1 + i % self.queues
            self.schedule(self.rng.randint(0, 2000), lambda g=guid, q=self.posted_to[guid]: self.producer.post(g, q))
        for _ in range(self.faults):
            self.schedule(self.rng.randint(0, 2500), self._fault)
        self.schedule(0, self._tick)
        self.horizon_ms = horizon_ms
        while self._events and self.now < horizon_ms:
            self.now, _, action = heapq.heappop(self._events)
            action()
            self.check_always()

    def _tick(self) -> None:
        self.producer.tick()
        self.consumer.tick()
        self.primary.tick()
        self.proxy.tick()
        self.replica.tick()
        if self.now <= 3000 or not self.quiescent():
            self.schedule(5, self._tick)  # the run ends when nothing is left to do

    def quiescent(self) -> bool:
        acked = set(self.producer.acks)
        return (len(acked) + len(self.producer.failed) == self.messages
                and acked <= set(self.consumer.delivered))

    def check_always(self) -> None:
        """Invariants after every step (the ACK checks only when ACKs changed)."""
        answered = self.producer.answered
        if answered == getattr(self, "_answered", -1):
            return
        self._answered = answered
        twice = [g for counts in (self.producer.acks, self.producer.failed) for g, n in counts.items() if n > 1]
        assert not twice, f"seed {self.seed}: PUTs ACKed more than once: {len(twice)}"
        both = set(self.producer.acks) & set(self.producer.failed)
        assert not both, f"seed {self.seed}: PUTs both ACKed and failed: {len(both)}"
        lost = set(self.producer.acks) - self.primary.log_set
        assert not lost, f"seed {self.seed}: ACKed but not in the durable log: {len(lost)}"

    def check_end(self) -> None:
        """Invariants once the run is over."""
        unanswered = self.messages - len(self.producer.acks) - len(self.producer.failed)
        assert unanswered == 0, f"seed {self.seed}: {unanswered} PUTs never answered; log tail {self.log[-5:]}"
        failed = set(self.producer.failed) - self.primary.refused
        assert not failed, f"seed {self.seed}: {len(failed)} PUTs failed"
        unrefused = self.primary.refused - set(self.producer.failed)
        assert not unrefused, f"seed {self.seed}: {len(unrefused)} PUTs refused by the primary but not failed"
        missing = set(self.producer.acks) - set(self.consumer.delivered)
        assert not missing, f"seed {self.seed}: {len(missing)} ACKed messages never delivered; {self.log[-5:]}"
        misrouted = [g for g, q in self.consumer.delivered_to.items() if self.posted_to.get(g) != q]
        assert not misrouted, f"seed {self.seed}: {len(misrouted)} messages pushed on another queue than their PUT's"
