"""Primary leases and fencing: the pure state machine, then the real Delta
commits that back it (a temp directory, no JVM, no sockets)."""

import threading
import time
import uuid

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from storage import deltars
from storage.lease_machine import TRANSITIONS, Action, LeaseEvent, LeaseMachine, LeaseState, LeaseView
from storage.leases import Fenced, LeaseTable

LEASE_MS, RENEW_MS = 2000, 500


def view(version, epoch, holder="n1", released=False):
    return LeaseView(version, epoch, holder, f"{holder}:1", released)


def test_the_preferred_node_takes_a_free_lease_at_once_and_the_others_wait_their_rank():
    first, second = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS), LeaseMachine("n2", 1, LEASE_MS, RENEW_MS)
    assert first.observed(None, 0) is Action.ACQUIRE and first.next_epoch() == 1
    assert second.observed(None, 0) is Action.NONE
    assert second.observed(None, 999) is Action.NONE
    assert second.observed(None, 1000) is Action.ACQUIRE   # rank 1 waits half a lease for the preferred node
    assert first.acquired(1, 0) is Action.BECOME_PRIMARY and first.state is LeaseState.PRIMARY
    assert second.acquired(None, 1000) is Action.NONE and second.state is LeaseState.FOLLOWER


def test_a_follower_takes_over_only_after_a_full_lease_without_renewal():
    follower = LeaseMachine("n2", 1, LEASE_MS, RENEW_MS)
    t = 0
    for version in range(1, 20):           # renewals every 500 ms keep it quiet
        t += RENEW_MS
        assert follower.observed(view(version, 3), t) is Action.NONE
    assert follower.observed(view(19, 3), t + LEASE_MS + 999) is Action.NONE      # lease + rank delay
    assert follower.observed(view(19, 3), t + LEASE_MS + 1000) is Action.ACQUIRE
    assert follower.next_epoch() == 4
    assert follower.acquired(4, t) is Action.BECOME_PRIMARY and follower.epoch == 4


def test_the_next_node_in_line_after_the_holder_takes_a_lapsed_lease_without_a_rank_delay():
    """The holder whose lease ran out is not waited for: of three nodes, the
    preferred one (n1) went quiet; n2 takes over when the lease runs out and
    n3 half a lease later. Had n2 held it, n1 and n3 would be first and
    second in line."""
    ranks = {"n1": 0, "n2": 1, "n3": 2}
    second, third = (LeaseMachine(n, ranks[n], LEASE_MS, RENEW_MS, ranks=ranks) for n in ("n2", "n3"))
    for m in (second, third):
        assert m.observed(view(7, 3, "n1"), 0) is Action.NONE
    assert second.observed(view(7, 3, "n1"), LEASE_MS - 1) is Action.NONE
    assert second.observed(view(7, 3, "n1"), LEASE_MS) is Action.ACQUIRE
    assert third.observed(view(7, 3, "n1"), LEASE_MS + 999) is Action.NONE
    assert third.observed(view(7, 3, "n1"), LEASE_MS + 1000) is Action.ACQUIRE
    first, third = (LeaseMachine(n, ranks[n], LEASE_MS, RENEW_MS, ranks=ranks) for n in ("n1", "n3"))
    for m in (first, third):
        assert m.observed(view(9, 4, "n2"), 0) is Action.NONE
    assert first.observed(view(9, 4, "n2"), LEASE_MS) is Action.ACQUIRE
    assert third.observed(view(9, 4, "n2"), LEASE_MS + 999) is Action.NONE   # n1 is still ahead
    assert third.observed(view(9, 4, "n2"), LEASE_MS + 1000) is Action.ACQUIRE
    # Released by n1 (a graceful stop): n2 takes it at once, n3 after half a lease.
    second, third = (LeaseMachine(n, ranks[n], LEASE_MS, RENEW_MS, ranks=ranks) for n in ("n2", "n3"))
    assert second.observed(view(8, 3, "n1", released=True), 0) is Action.ACQUIRE
    assert third.observed(view(8, 3, "n1", released=True), 0) is Action.NONE
    assert third.observed(view(8, 3, "n1", released=True), 1000) is Action.ACQUIRE


def test_a_released_lease_or_one_held_under_this_nodes_own_name_is_taken_at_once():
    assert LeaseMachine("n2", 0, LEASE_MS, RENEW_MS).observed(view(5, 2, released=True), 0) is Action.ACQUIRE
    assert LeaseMachine("n1", 2, LEASE_MS, RENEW_MS).observed(view(5, 2, "n1"), 0) is Action.ACQUIRE


def test_the_primary_renews_on_time_and_a_late_renewal_keeps_the_lease_only_if_its_commit_wins():
    m = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS)
    m.observed(None, 0)
    m.acquired(1, 0)
    assert m.tick(499) is Action.NONE and m.tick(500) is Action.RENEW
    assert m.renewed(True, 500) is Action.NONE
    assert m.tick(999) is Action.NONE and m.tick(1000) is Action.RENEW
    # Starved or frozen past the lease: it does not serve on its own clock's
    # say-so, it renews, and the conditional commit decides.
    late = 500 + LEASE_MS + 1500
    assert m.lapsed(late) and m.tick(late) is Action.RENEW and m.state is LeaseState.PRIMARY
    assert m.renewed(True, late) is Action.NONE and not m.lapsed(late + 1)  # nobody took it
    assert m.tick(late + LEASE_MS) is Action.RENEW
    assert m.renewed(False, late + LEASE_MS) is Action.STEP_DOWN and m.state is LeaseState.FOLLOWER  # somebody did


def test_a_refused_renewal_or_a_fenced_commit_steps_down_and_stop_releases():
    m = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS)
    m.observed(None, 0)
    m.acquired(1, 0)
    assert m.renewed(False, 500) is Action.STEP_DOWN
    m2 = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS)
    m2.observed(None, 0)
    m2.acquired(1, 0)
    assert m2.fenced() is Action.STEP_DOWN and m2.fenced() is Action.NONE
    m3 = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS)
    m3.observed(None, 0)
    m3.acquired(1, 0)
    assert m3.stop() is Action.RELEASE and m3.state is LeaseState.STOPPED
    assert m3.observed(None, 10_000) is Action.NONE


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def table_root(request, tmp_path) -> str:
    """Where the race tests put their tables: the local disk, and an
    S3-compatible object store (SeaweedFS, `object_store`), where
    put-if-absent is the store's conditional write."""
    if request.param == "local":
        return str(tmp_path)
    store = request.getfixturevalue("object_store")
    return f"s3://{store.bucket}/{uuid.uuid4().hex[:12]}"


def test_only_one_of_two_nodes_racing_for_a_lease_wins_and_the_loser_cannot_renew(table_root):
    path = f"{table_root}/lease"
    tables = [LeaseTable(path), LeaseTable(path)]
    LeaseTable(path).acquire(1, "n0", "a:0", 1)          # epoch 1 exists; both race for 2
    results: list[bool] = [False, False]
    barrier = threading.Barrier(2)

    def race(i):
        barrier.wait()
        results[i] = tables[i].acquire(2, f"n{i + 1}", f"a:{i + 1}", 2)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True]
    winner = results.index(True)
    lease = LeaseTable(path).read()
    assert lease is not None and (lease.epoch, lease.holder) == (2, f"n{winner + 1}")
    assert tables[winner].renew(2) and not tables[1 - winner].renew(1)
    assert tables[1 - winner].acquire(3, "late", "a:9", 3)  # a later takeover bumps the epoch
    assert not tables[winner].renew(2)                      # and the old holder's renewal fails
    assert tables[winner].release(2, "n", "a", 4) is False


def test_a_late_renewal_racing_a_takeover_never_both_succeed(table_root):
    """Why a late holder may renew instead of stepping down on its own clock:
    its renewal and a follower's acquire are both conditional commits (the
    acquire on the version the follower saw go quiet), so exactly one wins,
    in whatever order they land."""
    path = f"{table_root}/lease"
    holder, follower = LeaseTable(path), LeaseTable(path)
    holder.acquire(1, "n1", "a:1", 1)
    for epoch in range(1, 6):
        outcome: dict[str, bool] = {}
        barrier = threading.Barrier(2)
        lapsed_at = LeaseTable(path).read().version   # what the follower watched go quiet

        def renew(e=epoch):
            barrier.wait()
            outcome["renew"] = holder.renew(e)

        def take(e=epoch, v=lapsed_at):
            barrier.wait()
            outcome["take"] = follower.acquire(e + 1, "n2", "a:2", e + 1, expected_version=v)

        threads = [threading.Thread(target=renew), threading.Thread(target=take)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcome["take"] and not outcome["renew"] or outcome["renew"] and not outcome["take"], outcome
        if outcome["renew"]:
            assert follower.acquire(epoch + 1, "n2", "a:2", epoch + 1)  # a later takeover still works
        holder, follower = follower, holder  # the new holder is renewed next round
        assert LeaseTable(path).read().epoch == epoch + 1


def test_a_stale_primarys_commit_is_refused_after_a_new_primary_fences_the_table(table_root):
    path = f"{table_root}/puts"
    schema = pa.schema([pa.field("x", pa.int64())])
    old = deltars.Appender(path, schema, epoch=1)
    old.append(pa.table({"x": [1]}, schema=schema))
    new = deltars.Appender(path, schema, epoch=2)            # claims the table for epoch 2
    new.append(pa.table({"x": [2]}, schema=schema))
    with pytest.raises(Fenced):
        old.append(pa.table({"x": [99]}, schema=schema))     # its snapshot predates the claim
    with pytest.raises(Fenced):
        old.append(pa.table({"x": [99]}, schema=schema))     # and after refreshing it sees epoch 2
    with pytest.raises(Fenced):
        deltars.Appender(path, schema, epoch=1)              # an older epoch cannot claim it back
    rows = deltars.try_open(path).to_pyarrow_table()["x"].to_pylist()
    assert sorted(rows) == [1, 2]


def test_a_stale_primary_is_fenced_after_an_unsettled_append_too(table_root):
    """The primary answers its PUTs before its handle moves to their commit
    (`settle=False`); a newer primary's claim in between is still seen by the
    next append, which settles first."""
    path = f"{table_root}/puts"
    schema = pa.schema([pa.field("x", pa.int64())])
    old = deltars.Appender(path, schema, epoch=1)
    old.append(pa.table({"x": [1]}, schema=schema), settle=False)
    new = deltars.Appender(path, schema, epoch=2)
    with pytest.raises(Fenced):
        old.append(pa.table({"x": [99]}, schema=schema), settle=False)
    new.append(pa.table({"x": [2]}, schema=schema), settle=False)
    assert sorted(deltars.try_open(path).to_pyarrow_table()["x"].to_pylist()) == [1, 2]


def test_the_epoch_is_read_again_only_when_another_writer_committed_since(tmp_path, monkeypatch):
    """Reading the epoch from the snapshot costs 0.5 ms and more under load;
    a snapshot that holds only this appender's own commits since the last
    read cannot hold a newer claim."""
    from storage.leases import FencedAppender

    path = str(tmp_path / "puts")   # local: an unsettled append leaves the handle behind its commit
    schema = pa.schema([pa.field("x", pa.int64())])
    checks: list[int] = []
    real = FencedAppender.check
    monkeypatch.setattr(FencedAppender, "check", lambda self: checks.append(self.table.version()) or real(self))
    appender = deltars.Appender(path, schema, epoch=1)
    appender.log = None   # delta-rs's commit path (the local log reads other writers' commits instead)
    checks.clear()
    for settle in (True, False, False, True, False):
        appender.append(pa.table({"x": [1]}, schema=schema), settle=settle)
    assert checks == []
    write_deltalake(path, pa.table({"x": [2]}, schema=schema), mode="append")   # another writer (compaction, say)
    appender.append(pa.table({"x": [3]}, schema=schema), settle=False)         # settles onto it first
    assert len(checks) == 1
    appender.append(pa.table({"x": [4]}, schema=schema))
    assert len(checks) == 1


# -- the transition table, exhaustively ------------------------------------------
def machine_in(state: LeaseState) -> LeaseMachine:
    """A machine brought to `state` through its own transitions."""
    machine = LeaseMachine("n1", 0, LEASE_MS, RENEW_MS)
    if state in (LeaseState.ACQUIRING, LeaseState.PRIMARY):
        assert machine.observed(None, 0) is Action.ACQUIRE
    if state is LeaseState.PRIMARY:
        assert machine.acquired(1, 0) is Action.BECOME_PRIMARY
    if state is LeaseState.STOPPED:
        machine.stop()
    assert machine.state is state
    return machine


def fire_through_the_api(machine: LeaseMachine, event: LeaseEvent) -> Action:
    """Each event as the node produces it, through the method it calls."""
    if event is LeaseEvent.TAKEABLE:
        if machine.state is LeaseState.FOLLOWER:
            return machine.observed(None, 10**9)     # a free lease, long past any rank delay
        return machine.fire(event)                    # only a follower reads the table
    if event is LeaseEvent.HELD:
        return machine.observed(view(5, 3, holder="n2"), 0)  # someone else's, just seen renewed
    if event is LeaseEvent.ACQUIRED:
        return machine.acquired(7, 0)
    if event is LeaseEvent.ACQUIRE_FAILED:
        return machine.acquired(None, 0)
    if event is LeaseEvent.RENEW_DUE:
        return machine.tick(machine.renewed_ms + RENEW_MS)
    if event is LeaseEvent.RENEW_NOT_DUE:
        return machine.tick(machine.renewed_ms + RENEW_MS - 1)
    if event is LeaseEvent.RENEWED:
        return machine.renewed(True, 0)
    if event is LeaseEvent.RENEW_REFUSED:
        return machine.renewed(False, 0)
    if event is LeaseEvent.FENCED:
        return machine.fenced()
    assert event is LeaseEvent.STOP
    return machine.stop()


def test_the_transition_table_is_total():
    missing = [(s, e) for s in LeaseState for e in LeaseEvent if (s, e) not in TRANSITIONS]
    assert not missing and len(TRANSITIONS) == len(LeaseState) * len(LeaseEvent)


@pytest.mark.parametrize("state", list(LeaseState), ids=lambda s: s.value)
@pytest.mark.parametrize("event", list(LeaseEvent), ids=lambda e: e.value)
def test_every_state_and_event_does_what_the_table_says(state, event):
    machine = machine_in(state)
    action = fire_through_the_api(machine, event)
    assert (action, machine.state) == TRANSITIONS[(state, event)]


def test_only_a_primary_steps_down_or_releases_and_only_an_acquire_makes_one():
    for (state, event), (action, after) in TRANSITIONS.items():
        if action in (Action.STEP_DOWN, Action.RELEASE, Action.RENEW):
            assert state is LeaseState.PRIMARY, (state, event)
        if after is LeaseState.PRIMARY and state is not LeaseState.PRIMARY:
            assert (state, event, action) == (LeaseState.ACQUIRING, LeaseEvent.ACQUIRED, Action.BECOME_PRIMARY)
        if state is LeaseState.STOPPED:
            assert (action, after) == (Action.NONE, LeaseState.STOPPED), "STOPPED is final"


def test_a_lease_commit_that_fails_leaves_the_node_free_to_try_again(tmp_path):
    """An acquire whose commit raises (a full disk) must not leave the
    partition taking over for ever: the next round tries again and wins."""
    import conf
    from primary.leadership import Leadership, Where
    config = conf.ClusterConfig(data_dir=str(tmp_path))
    served: list[tuple[int, int]] = []

    class Served:
        def stop(self) -> None:
            pass

    def serve(p: int, epoch: int) -> Served:
        served.append((p, epoch))
        return Served()

    leadership = Leadership(config, config.nodes[0].name, serve=serve, stepped_down=lambda p, part: None)
    table = leadership._tables[0]
    real_acquire, failures = table.acquire, []

    def full_disk_once(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OSError(28, "No space left on device")
        return real_acquire(*args, **kwargs)

    table.acquire = full_disk_once  # type: ignore[method-assign]
    with pytest.raises(OSError):
        leadership._keep_lease(0)
    assert leadership._machines[0].state is LeaseState.FOLLOWER
    leadership._keep_lease(0)
    assert leadership._machines[0].state is LeaseState.PRIMARY
    deadline = time.monotonic() + 10
    while leadership.where(0) is not Where.HERE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served == [(0, 1)] and leadership.where(0) is Where.HERE


# -- the lease table's own log ---------------------------------------------------
def _log_versions(path: str) -> list[int]:
    import os
    return sorted(int(name[:-5]) for name in os.listdir(os.path.join(path, "_delta_log")) if name.endswith(".json"))


def test_a_lease_table_keeps_a_minute_of_log_and_an_older_table_is_moved_to_it(tmp_path):
    """Every refresh and commit of the lease lists its whole log on a local
    disk, so the table keeps a minute of it (`LEASE_TABLE_PROPERTIES`). A
    table made with an hour, as before, gets the new properties from a
    node that writes to it, after its write."""
    from deltalake import DeltaTable

    from storage.leases import LEASE_SCHEMA, LEASE_TABLE_PROPERTIES

    assert LEASE_TABLE_PROPERTIES["delta.logRetentionDuration"] == "interval 1 minutes"
    new = str(tmp_path / "new")
    assert LeaseTable(new).acquire(1, "n1", "a:1", 1)
    table = DeltaTable(new)
    assert table.metadata().configuration == LEASE_TABLE_PROPERTIES
    assert table.version() == 1            # made, then the acquire: no commit of properties

    old = str(tmp_path / "old")
    DeltaTable.create(old, LEASE_SCHEMA, configuration={"delta.checkpointInterval": "20",
                                                        "delta.logRetentionDuration": "interval 1 hours"})
    holder = LeaseTable(old)
    assert holder.acquire(1, "n1", "a:1", 1)
    table = DeltaTable(old)
    assert table.metadata().configuration == LEASE_TABLE_PROPERTIES
    assert table.version() == 2            # the acquire, then the properties
    assert holder.renew(1) and holder.renew(1)
    lease = LeaseTable(old).read()
    assert lease is not None and (lease.epoch, lease.holder, lease.version) == (1, "n1", 4)


def test_a_lease_tables_expired_log_entries_are_removed_as_it_is_renewed(tmp_path, monkeypatch):
    """The mechanism the minute rests on, at a second: at each checkpoint
    (every 20 commits) delta-rs removes the log entries before the newest
    checkpoint older than the retention, and readers, old and new, still
    see the holder. So a table renewed twice a second keeps a minute of log
    and up to ten seconds more (130 files at the shipped cadence,
    docs/bench/twenty-sixth-2026-12-07/lease-paced.txt)."""
    import storage.leases as leases

    monkeypatch.setattr(leases, "LEASE_TABLE_PROPERTIES", {**leases.LEASE_TABLE_PROPERTIES,
                                                          "delta.logRetentionDuration": "interval 1 seconds"})
    path = str(tmp_path / "lease")
    holder = LeaseTable(path)
    assert holder.acquire(1, "n1", "a:1", 1)
    follower = LeaseTable(path)
    assert follower.read() is not None
    for _ in range(25):
        assert holder.renew(1)          # versions 2-26, a checkpoint at 19
    assert _log_versions(path) == list(range(27))
    time.sleep(1.2)
    for _ in range(20):
        assert holder.renew(1)          # versions 27-46, a checkpoint at 39 and the cleanup with it
    assert _log_versions(path) == list(range(19, 47))   # from the checkpoint at 19, which had expired
    for reader in (follower, LeaseTable(path)):   # one left at version 1, one new
        lease = reader.read()
        assert lease is not None and (lease.epoch, lease.holder, lease.version) == (1, "n1", 46)


def test_setting_an_older_tables_properties_that_fails_is_tried_again_after_the_next_write(tmp_path, monkeypatch):
    """The lease write it follows has landed: a failed metadata commit (here
    one that lost its version to another node's write) is no failed write,
    and the next write tries again."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.table import TableAlterer

    from storage.leases import LEASE_SCHEMA, LEASE_TABLE_PROPERTIES

    path = str(tmp_path / "old")
    DeltaTable.create(path, LEASE_SCHEMA, configuration={"delta.logRetentionDuration": "interval 1 hours"})
    real = TableAlterer.set_table_properties
    calls: list[int] = []

    def lose_the_first(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise CommitFailedError("another writer won the version")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TableAlterer, "set_table_properties", lose_the_first)
    holder = LeaseTable(path)
    assert holder.acquire(1, "n1", "a:1", 1)
    assert DeltaTable(path).metadata().configuration["delta.logRetentionDuration"] == "interval 1 hours"
    assert holder.renew(1)
    assert DeltaTable(path).metadata().configuration == LEASE_TABLE_PROPERTIES
    assert holder.renew(1) and len(calls) == 2      # settled: not tried again
