"""The tree under many random fault schedules (tests/simulation.py): seeded,
fake clock, no sockets. Set TAPROOT_SIM_SEEDS=N to run more schedules."""

import os

from simulation import Simulation

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


def test_the_simulation_catches_a_hop_that_forgets_its_buffer():
    """The checker is not vacuous: a relay that drops its retransmission buffer
    on failover (the old behaviour) breaks the invariants for some seed."""
    from replicas import relay

    original = relay.Relay.upstream_lost

    def forgetful(self):
        out = original(self)
        self._buffer.clear()
        return out

    relay.Relay.upstream_lost = forgetful
    try:
        broken = 0
        for seed in range(10):
            sim = Simulation(seed)
            try:
                sim.run(horizon_ms=10_000)  # a broken run never settles: do not simulate a minute of it
                sim.check_end()
            except AssertionError:
                broken += 1
        assert broken > 0
    finally:
        relay.Relay.upstream_lost = original
