"""A deterministic simulation of the distribution tree (seeded, injected clock).

    producer ─┐                     (each ─ is a link: frames are delayed a
              ├─ proxy ── replica ── primary ── "pipeline" (GUID dedup)
    consumer ─┘                      random time, and a cut loses whatever is
                                     in flight and ends both sides' view of it)

The two forwarding hops are the real `replicas.relay.Relay` state machine, the
code the proxy and the replicas run. The producer models the SDK's
retransmission buffer (resend every unacknowledged PUT, in order, after
reopening), the primary models group commit (ACK only after the commit; a crash
loses what is not committed, never what is), redelivery of unconfirmed
messages, and the pipeline's GUID dedup. Time is an integer millisecond clock;
nothing sleeps and nothing is random but the seeded generator, so a failing
seed replays exactly.

Faults: cut any link (the lower side reconnects after a random delay), crash
the primary (it restarts from its committed log with a new epoch). Links do not
drop single frames on a live connection: the real links are gRPC streams over
TCP, where loss ends the stream, which is a cut.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from protocol import ResultCode, pb, status
from protocol.retransmit import RetransmissionLimits
from replicas.relay import UPSTREAM, Relay

URI = "taproot://sim/q"


@dataclass(order=True)
class _Event:
    at: int
    order: int
    action: object = field(compare=False)


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
    """The SDK model: one queue; a producer keeps every PUT until its ACK and
    resends them in order after reopening; a consumer confirms what it gets."""

    def __init__(self, sim: "Simulation", name: str, upper: "Endpoint", read: bool):
        self.sim, self.name, self.upper, self.read = sim, name, upper, read
        self.link: Link | None = None
        self.pending: dict[bytes, pb.PutMessage] = {}
        self.acks: dict[bytes, int] = {}       # GUID -> number of ACKs seen by the application
        self.failed: dict[bytes, int] = {}
        self.delivered: list[bytes] = []
        self.requests = itertools.count(1)

    def connect(self) -> None:
        self.link = Link(self.sim, self.name, self, self.upper)
        self.upper.accept(self.link)
        self.link.send_up(pb.Frame(open_queue=pb.OpenQueue(request_id=next(self.requests), queue_id=1, uri=URI,
                                                           read=self.read, write=not self.read)))
        if self.pending:
            self.link.send_up(pb.Frame(put=pb.PutBatch(messages=list(self.pending.values()))))

    def post(self, guid: bytes) -> None:
        message = pb.PutMessage(queue_id=1, guid=guid, payload=guid)
        self.pending[guid] = message
        if self.link is not None and self.link.alive:
            self.link.send_up(pb.Frame(put=pb.PutBatch(messages=[message])))

    def receive_from_above(self, link: Link, frame: pb.Frame) -> None:
        kind = frame.WhichOneof("body")
        if kind == "ack":
            for ack in frame.ack.messages:
                if self.pending.pop(ack.guid, None) is not None:
                    bucket = self.acks if ack.code == ResultCode.SUCCESS else self.failed
                    bucket[ack.guid] = bucket.get(ack.guid, 0) + 1
        elif kind == "push":
            guids = [m.guid for m in frame.push.messages]
            self.delivered.extend(guids)
            link.send_up(pb.Frame(confirm=pb.ConfirmBatch(messages=[
                pb.ConfirmMessage(queue_id=1, guid=g) for g in guids])))

    def above_lost(self, link: Link) -> None:
        self.link = None
        self.sim.schedule(self.sim.rng.randint(1, 50), self.connect)


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
    """The primary, its durable log and the pipeline's dedup, as a model."""

    def __init__(self, sim: "Simulation"):
        self.sim = sim
        self.log: list[bytes] = []          # committed PUTs (durable: survives a crash)
        self.log_set: set[bytes] = set()
        self.confirmed: set[bytes] = set()  # durable too
        self.epoch = 1
        self.up = True
        self._volatile()

    def _volatile(self) -> None:
        self.links: dict[Link, dict[int, bool]] = {}     # link -> queue id -> read
        self.uncommitted: list[tuple[Link, pb.PutMessage]] = []
        self.in_flight: dict[bytes, tuple[Link, int]] = {}   # pushed, unconfirmed
        self.delivery: list[bytes] = []                      # the pipeline's output, deduplicated
        self.seen: set[bytes] = set()
        self.piped = 0

    def accept(self, link: Link) -> None:
        if not self.up:
            self.sim.schedule(0, link.cut)  # nobody listening: the connection fails
            return
        self.links[link] = {}

    def receive_from_below(self, link: Link, frame: pb.Frame) -> None:
        if not self.up or link not in self.links:
            return
        kind = frame.WhichOneof("body")
        queues = self.links[link]
        if kind == "open_queue":
            req = frame.open_queue
            queues[req.queue_id] = req.read
            link.send_down(pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(ResultCode.SUCCESS),
                dedup_history_window_ms=60_000)))
        elif kind == "put":
            for message in frame.put.messages:
                if message.queue_id in queues:
                    self.uncommitted.append((link, message))
                else:
                    link.send_down(pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(
                        queue_id=message.queue_id, guid=message.guid, code=ResultCode.INVALID_ARGUMENT)])))
        elif kind == "confirm":
            for message in frame.confirm.messages:
                if self.in_flight.get(message.guid, (None, 0))[0] is link:
                    del self.in_flight[message.guid]
                    self.confirmed.add(message.guid)
        elif kind == "close_queue":
            queues.pop(frame.close_queue.queue_id, None)
            self._release(link, frame.close_queue.queue_id)
        elif kind == "configure_queue":
            return  # flow control is not modelled: the primary caps each consumer at 20 in flight

    def _release(self, link: Link, queue_id: int | None = None) -> None:
        for guid, (holder, qid) in list(self.in_flight.items()):
            if holder is link and (queue_id is None or qid == queue_id):
                del self.in_flight[guid]

    def below_lost(self, link: Link) -> None:
        self.links.pop(link, None)
        self._release(link)  # its unconfirmed messages go to the next consumer

    def tick(self) -> None:
        if not self.up:
            return
        # Group commit: everything waiting becomes durable, then it is ACKed.
        if self.uncommitted and self.sim.rng.random() < 0.7:
            batch, self.uncommitted = self.uncommitted, []
            self.log.extend(m.guid for _, m in batch)
            self.log_set.update(m.guid for _, m in batch)
            for link, message in batch:
                if link.alive:
                    link.send_down(pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(
                        queue_id=message.queue_id, guid=message.guid, code=ResultCode.SUCCESS)])))
        # The pipeline: GUID dedup over the committed log.
        while self.piped < len(self.log):
            guid = self.log[self.piped]
            self.piped += 1
            if guid not in self.seen:
                self.seen.add(guid)
                self.delivery.append(guid)
        # Push what is neither confirmed nor held, to the first consumer with room.
        consumers = [(link, qid) for link, queues in self.links.items() for qid, read in queues.items() if read]
        if not consumers:
            return
        link, qid = consumers[0]
        held = sum(1 for holder, _ in self.in_flight.values() if holder is link)
        pushes = []
        for guid in self.delivery:
            if held >= 20:
                break
            if guid in self.confirmed or guid in self.in_flight:
                continue
            self.in_flight[guid] = (link, qid)
            pushes.append(pb.PushMessage(queue_id=qid, guid=guid, payload=guid))
            held += 1
        if pushes:
            link.send_down(pb.Frame(push=pb.PushBatch(messages=pushes)))

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
        # Recovery: the delivery log is rebuilt from the committed log.
        self.sim.log.append(f"{self.sim.now}: primary back (epoch {self.epoch})")


class Simulation:
    def __init__(self, seed: int, messages: int = 200, faults: int = 6,
                 limits: RetransmissionLimits | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.link_ids = itertools.count(1)
        self.log: list[str] = []
        self._events: list[_Event] = []
        self._order = itertools.count()
        limits = limits or RetransmissionLimits(timeout_ms=10**9)
        self.primary = Primary(self)
        self.replica = Hop(self, "replica", self.primary, limits)
        self.proxy = Hop(self, "proxy", self.replica, limits)
        self.producer = Client(self, "producer", self.proxy, read=False)
        self.consumer = Client(self, "consumer", self.proxy, read=True)
        self.messages = messages
        self.faults = faults
        self.posted: list[bytes] = []

    def schedule(self, delay: int, action) -> None:
        heapq.heappush(self._events, _Event(self.now + delay, next(self._order), action))

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
            self.schedule(self.rng.randint(0, 2000), lambda g=guid: self.producer.post(g))
        for _ in range(self.faults):
            self.schedule(self.rng.randint(0, 2500), self._fault)
        self.schedule(0, self._tick)
        self.horizon_ms = horizon_ms
        while self._events and self.now < horizon_ms:
            event = heapq.heappop(self._events)
            self.now = event.at
            event.action()
            self.check_always()

    def _tick(self) -> None:
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
        answered = len(self.producer.acks) + len(self.producer.failed)
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
        assert not self.producer.failed, f"seed {self.seed}: {len(self.producer.failed)} PUTs failed"
        missing = set(self.producer.acks) - set(self.consumer.delivered)
        assert not missing, f"seed {self.seed}: {len(missing)} ACKed messages never delivered; {self.log[-5:]}"
