"""The tree under many random fault schedules (tests/simulation.py): seeded,
fake clock, no sockets. Set TAPROOT_SIM_SEEDS=N to run more schedules."""

import os

import pytest
import simulation
from simulation import Simulation

from primary.dispatcher import QueueDispatcher
from protocol import ResultCode, columns, pb
from protocol.retransmit import RetransmissionBuffer, RetransmissionLimits
from replicas.relay import Relay

SEEDS = int(os.environ.get("TAPROOT_SIM_SEEDS", "30"))


def test_every_put_is_acked_once_and_every_acked_message_is_delivered_under_random_faults():
    failures = []
    for seed in range(SEEDS):
        sim = Simulation(seed)
        try:
            sim.run()
            sim.check_end()
        except AssertionError as exc:
            failures.append(f"seed {seed}: {exc}")
    assert not failures, f"{len(failures)} of {SEEDS} schedules broke an invariant:\n" + "\n".join(failures[:10])


def test_a_schedule_replays_exactly_from_its_seed():
    runs = []
    for _ in range(2):
        sim = Simulation(7)
        sim.run()
        runs.append((sim.now, sim.log, list(sim.consumer.delivered)))
    assert runs[0] == runs[1]


def broken_invariants(seeds: int = 10, until: str | None = None, **kwargs) -> list[str]:
    """The invariant failures over `seeds` schedules (a broken run never
    settles: do not simulate a minute of it); with `until`, up to the first
    failure that names it."""
    failures = []
    for seed in range(seeds):
        sim = Simulation(seed, **kwargs)
        try:
            sim.run(horizon_ms=10_000)
            sim.check_end()
        except AssertionError as exc:
            failures.append(str(exc))
            if until is not None and until in failures[-1]:
                break
    return failures


def _forgetful_upstream_lost(original):
    def upstream_lost(self):
        out = original(self)
        self._buffer.clear()  # the old behaviour: a hop dropped its buffer on failover
        return out
    return upstream_lost


def _release_keeping(self, key):
    return self._entries.get(key)  # "releases" an entry but keeps it: its PUT can be answered again


def _expire_keeping(self, now_ms):
    return [(k, h) for k, h in self._entries.items() if h.deadline_ms <= now_ms]  # answered, still resent


def _refuse_all(self, nbytes, count=1):
    return ResultCode.LIMIT_MESSAGES, "seeded bug: everything refused"


def _ack_on_receipt(original):
    def receive_from_below(self, link, frame):
        if frame.WhichOneof("body") in ("put", "put_columns") and self.up and link in self.links:
            before = len(self.uncommitted)
            original(self, link, frame)
            for held in self.uncommitted[before:]:   # ACKed before the commit: a crash loses them
                if held[2] is None:   # a single PUT
                    link.send_down(pb.Frame(ack=pb.AckBatch(messages=[pb.AckMessage(
                        queue_id=held[1], guid=held[3][0][0].guid, code=ResultCode.SUCCESS)])))
                else:
                    link.send_down(pb.Frame(ack_columns=pb.AckColumns(
                        queue_id=held[1], guids=held[2], code=ResultCode.SUCCESS)))
            return
        original(self, link, frame)
    return receive_from_below


def _remove_consumer_dropping(self, key):
    consumer = self._consumers.pop(key, None)
    if consumer is not None:
        self._rr.remove(key)  # its unconfirmed messages are forgotten instead of redelivered
    return []


def _one_dispatcher(original):
    def dispatcher(self, uri):
        return original(self, simulation.URI)   # every queue's messages to queue 1's consumers
    return dispatcher


def _refused_rows_shifted(original):
    def ack_columns(queue_id, guids, code, text, refused):
        return original(queue_id, guids, code, text, {row + 1: why for row, why in refused.items()})
    return ack_columns


SEEDED_BUGS = {
    "PUTs ACKed more than once": (RetransmissionBuffer, "release", lambda _: _release_keeping, {}),
    "PUTs both ACKed and failed": (RetransmissionBuffer, "expire", lambda _: _expire_keeping,
                                   {"session_limits": RetransmissionLimits(timeout_ms=100)}),
    "ACKed but not in the durable log": (simulation.Primary, "receive_from_below", _ack_on_receipt, {}),
    "PUTs never answered": (Relay, "upstream_lost", _forgetful_upstream_lost, {}),
    "PUTs failed": (RetransmissionBuffer, "refusal", lambda _: _refuse_all, {}),
    "ACKed messages never delivered": (QueueDispatcher, "remove_consumer", lambda _: _remove_consumer_dropping, {}),
    "pushed on another queue than their PUT's": (simulation.Primary, "dispatcher", _one_dispatcher, {"queues": 3}),
}


@pytest.mark.parametrize("invariant", list(SEEDED_BUGS))
def test_each_invariant_fails_on_a_seeded_bug(invariant, monkeypatch):
    """The checker is not vacuous: each invariant, and that one, catches a
    bug planted in the real code (or, for durability, in the modelled commit)."""
    owner, name, make, kwargs = SEEDED_BUGS[invariant]
    monkeypatch.setattr(owner, name, make(getattr(owner, name)))
    failures = broken_invariants(until=invariant, **kwargs)
    assert any(invariant in f for f in failures), failures[:3]


def test_a_correct_tree_breaks_none_of_them():
    assert broken_invariants() == []


def test_a_frame_refused_in_part_answers_each_put_with_its_own_code():
    """Frames of single PUTs whose primary refuses some rows on their own (a
    quota stand-in): those PUTs fail, and only those; the rest of each frame
    is ACKed and delivered, through the same faults."""
    refused = partly = 0
    for seed in range(10):
        sim = Simulation(seed, refuse_rows=True)
        sim.run(horizon_ms=10_000)
        sim.check_end()
        refused += len(sim.primary.refused)
        partly += sim.primary.partly_refused
    assert refused > 0 and partly > 0


def test_an_answer_naming_the_wrong_rows_is_caught(monkeypatch):
    """The primary's answer names the row after each one it refused: the
    refused PUT is ACKed though never stored, and the checker says so."""
    monkeypatch.setattr(columns, "ack_columns", _refused_rows_shifted(columns.ack_columns))
    failures = broken_invariants(until="ACKed but not in the durable log", refuse_rows=True)
    assert any("ACKed but not in the durable log" in f for f in failures), failures[:3]


def test_frames_spanning_queues_are_resent_after_failover_and_refused_in_part_without_breaking_any():
    """Producer and consumer sessions of three queues: the few PUTs of
    several queues share frames, resent after link cuts and primary crashes
    once all their queues are reopened, some rows refused on their own; each
    queue's messages are pushed on that queue, and every invariant holds."""
    frames = resent = partly = 0
    for seed in range(24):   # 227 such frames, 25 resent, 43 refused in part
        sim = Simulation(seed, queues=3, refuse_rows=seed % 2 == 1, faults=10)
        sim.run(horizon_ms=10_000)
        sim.check_end()
        frames += len(sim.primary.spanning_seen)
        resent += sum(1 for n in sim.primary.spanning_seen.values() if n > 1)
        partly += sim.primary.spanning_partly
    assert frames > 0 and resent > 0 and partly > 0, (frames, resent, partly)
