"""One node's view of one partition's lease: the pure state machine behind
`storage.leases` (which does the Delta commits) and `primary.leadership`
(which runs it). Time comes in as `now_ms`; nothing here reads a clock,
starts a thread or touches a table.

The machine is its transition table, `TRANSITIONS`: for every state and every
event, the action the node must take and the next state. The methods only
classify what they are told into an event (`observed` decides whether a read
of the table shows a lease this node may take), fire it, and keep the data
the guards need (the epoch, when the lease was last renewed, what a follower
last saw and since when). The table is total, and a test walks every pair.

Why these rules:

- A late holder (a starved or frozen process) does not step down on its own
  clock: it renews, and the commit decides. A renewal is conditional: it fails
  if any commit carrying a newer epoch landed first. A follower's acquire is
  conditional too: it fails if the table changed since the version it watched
  go quiet. Of two such commits in flight, the second fails as a concurrent
  transaction. So exactly one of a late renewal and a takeover wins, in either
  order, and a holder whose renewal fails steps down. Stepping down on the
  clock instead made a single node under full load on 2 cores drop its own
  partitions every few seconds (its keeper thread ran 2-4 s late).
- "Free" is a table that does not exist yet or whose holder released it. The
  rank delay (`rank * lease_duration_ms / 2`) lets the partition's preferred
  node (rank 0) take a free lease first, so the static assignment holds when
  every node is up, whatever order they start in.
- The holder of a lease that lapsed or was released does not count in the
  rank: the first node in line after it takes over as soon as the lease runs
  out, without waiting half a lease for a node that just went quiet. (The
  rank delay only keeps two takeovers from racing; the conditional commits
  decide the race anyway.)
- A lease held under this node's own name was left by a previous run of this
  node that died without releasing: nobody else can renew it, so it is taken
  back at once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseView:
    """What a read of the lease table shows."""
    version: int          # the table's Delta version (changes on every renewal)
    epoch: int            # 0: never held
    holder: str
    address: str
    released: bool


class LeaseState(enum.Enum):
    FOLLOWER = "follower"
    ACQUIRING = "acquiring"
    PRIMARY = "primary"
    STOPPED = "stopped"


class Action(enum.Enum):
    NONE = "none"
    ACQUIRE = "acquire"            # try to commit epoch + 1
    RENEW = "renew"
    BECOME_PRIMARY = "become-primary"
    STEP_DOWN = "step-down"        # stop writing now; another node has or will have the lease
    RELEASE = "release"


class LeaseEvent(enum.Enum):
    TAKEABLE = "takeable"              # a read shows a free lease (after the rank delay), this node's own
                                       # name, or no renewal for lease + rank delay
    HELD = "held"                      # a read shows a lease someone else keeps renewing
    ACQUIRED = "acquired"              # this node's acquire commit won
    ACQUIRE_FAILED = "acquire-failed"  # it lost (another commit landed first) or could not be written
    RENEW_DUE = "renew-due"            # the renew interval has passed since the last renewal
    RENEW_NOT_DUE = "renew-not-due"
    RENEWED = "renewed"                # the renewal commit won
    RENEW_REFUSED = "renew-refused"    # it lost: a newer epoch exists
    FENCED = "fenced"                  # a data commit met a newer epoch
    STOP = "stop"                      # the node is stopping


F, A, P, S = LeaseState.FOLLOWER, LeaseState.ACQUIRING, LeaseState.PRIMARY, LeaseState.STOPPED
E = LeaseEvent
NONE = Action.NONE

# (state, event) -> (action, next state). Total: every pair is written out.
TRANSITIONS: dict[tuple[LeaseState, LeaseEvent], tuple[Action, LeaseState]] = {
    (F, E.TAKEABLE): (Action.ACQUIRE, A),
    (F, E.HELD): (NONE, F),
    (F, E.ACQUIRED): (NONE, F),            # an answer to no acquire of ours
    (F, E.ACQUIRE_FAILED): (NONE, F),
    (F, E.RENEW_DUE): (NONE, F),
    (F, E.RENEW_NOT_DUE): (NONE, F),
    (F, E.RENEWED): (NONE, F),
    (F, E.RENEW_REFUSED): (NONE, F),
    (F, E.FENCED): (NONE, F),              # already stepped down
    (F, E.STOP): (NONE, S),

    (A, E.TAKEABLE): (NONE, A),            # the acquire is in flight
    (A, E.HELD): (NONE, A),
    (A, E.ACQUIRED): (Action.BECOME_PRIMARY, P),
    (A, E.ACQUIRE_FAILED): (NONE, F),      # someone else won: watch their lease afresh
    (A, E.RENEW_DUE): (NONE, A),
    (A, E.RENEW_NOT_DUE): (NONE, A),
    (A, E.RENEWED): (NONE, A),
    (A, E.RENEW_REFUSED): (NONE, A),
    (A, E.FENCED): (NONE, A),              # nothing written yet to fence
    (A, E.STOP): (NONE, S),                # nothing to release: the acquire did not land

    (P, E.TAKEABLE): (NONE, P),
    (P, E.HELD): (NONE, P),
    (P, E.ACQUIRED): (NONE, P),
    (P, E.ACQUIRE_FAILED): (NONE, P),
    (P, E.RENEW_DUE): (Action.RENEW, P),   # late or not: the conditional commit decides
    (P, E.RENEW_NOT_DUE): (NONE, P),
    (P, E.RENEWED): (NONE, P),
    (P, E.RENEW_REFUSED): (Action.STEP_DOWN, F),
    (P, E.FENCED): (Action.STEP_DOWN, F),
    (P, E.STOP): (Action.RELEASE, S),      # hand over at once instead of letting it lapse

    (S, E.TAKEABLE): (NONE, S),
    (S, E.HELD): (NONE, S),
    (S, E.ACQUIRED): (NONE, S),
    (S, E.ACQUIRE_FAILED): (NONE, S),
    (S, E.RENEW_DUE): (NONE, S),
    (S, E.RENEW_NOT_DUE): (NONE, S),
    (S, E.RENEWED): (NONE, S),
    (S, E.RENEW_REFUSED): (NONE, S),
    (S, E.FENCED): (NONE, S),
    (S, E.STOP): (NONE, S),
}
del F, A, P, S, E, NONE


class LeaseMachine:
    """One node's view of one partition's lease (see the module docstring)."""

    def __init__(self, node: str, rank: int, lease_duration_ms: int, renew_interval_ms: int,
                 ranks: Mapping[str, int] | None = None):
        """`ranks`: every node's rank for this partition (this node's is
        `rank`), so a takeover can leave the holder out of the line."""
        if renew_interval_ms * 2 > lease_duration_ms:
            raise ValueError("renew at least twice per lease")
        self.node = node
        self.rank = rank
        self.ranks = dict(ranks or {})
        self.lease_duration_ms = lease_duration_ms
        self.renew_interval_ms = renew_interval_ms
        self.state = LeaseState.FOLLOWER
        self.epoch = 0
        self._seen: LeaseView | None = None
        self._seen_since_ms: float | None = None
        self._renewed_ms = 0.0     # start of the last successful acquire or renewal

    def fire(self, event: LeaseEvent) -> Action:
        """Apply `TRANSITIONS` for the current state and `event`."""
        before = self.state
        action, self.state = TRANSITIONS[(before, event)]
        if before is not LeaseState.FOLLOWER and self.state is LeaseState.FOLLOWER:
            self._seen_since_ms = None  # a follower again: watch the lease afresh
        return action

    def rank_delay_after_ms(self, holder: str | None) -> float:
        """The rank delay (`rank * lease_duration_ms / 2`) with `holder` (the
        node whose lease lapsed or was released; None: there is none) out of
        the line."""
        rank = self.rank
        if holder is not None and holder != self.node and self.ranks.get(holder, rank) < rank:
            rank -= 1
        return rank * self.lease_duration_ms / 2

    def takeable(self, view: LeaseView | None, now_ms: float) -> bool:
        """Whether this read of the table shows a lease this node may take
        now. Notes the read: a follower times the quiet from the last change."""
        key = None if view is None else (view.version, view.epoch)
        seen_key = None if self._seen is None else (self._seen.version, self._seen.epoch)
        if self._seen_since_ms is None or key != seen_key:
            self._seen, self._seen_since_ms = view, now_ms
        quiet_ms = now_ms - self._seen_since_ms
        free = view is None or view.released or view.epoch == 0
        mine = view is not None and view.holder == self.node and not view.released
        delay_ms = self.rank_delay_after_ms(None if view is None or view.epoch == 0 else view.holder)
        return (free and quiet_ms >= delay_ms) or mine or quiet_ms >= self.lease_duration_ms + delay_ms

    def observed(self, view: LeaseView | None, now_ms: float) -> Action:
        """A follower read the table (None: it does not exist yet)."""
        if self.state is not LeaseState.FOLLOWER:
            return self.fire(LeaseEvent.HELD)  # not watching: a no-op in every other state
        return self.fire(LeaseEvent.TAKEABLE if self.takeable(view, now_ms) else LeaseEvent.HELD)

    def next_epoch(self) -> int:
        return (self._seen.epoch if self._seen is not None else 0) + 1

    def acquired(self, epoch: int | None, started_ms: float) -> Action:
        """The acquire commit's outcome: the epoch won, or None if it lost."""
        action = self.fire(LeaseEvent.ACQUIRE_FAILED if epoch is None else LeaseEvent.ACQUIRED)
        if action is Action.BECOME_PRIMARY:
            assert epoch is not None
            self.epoch, self._renewed_ms = epoch, started_ms
        return action

    def tick(self, now_ms: float) -> Action:
        due = now_ms - self._renewed_ms >= self.renew_interval_ms
        return self.fire(LeaseEvent.RENEW_DUE if due else LeaseEvent.RENEW_NOT_DUE)

    def lapsed(self, now_ms: float) -> bool:
        """A follower may have seen the lease lapse by now."""
        return now_ms - self._renewed_ms >= self.lease_duration_ms

    @property
    def renewed_ms(self) -> float:
        """When the current lease was last renewed (or taken), on this node's clock."""
        return self._renewed_ms

    def renewed(self, ok: bool, started_ms: float) -> Action:
        """The renewal commit's outcome."""
        was_primary = self.state is LeaseState.PRIMARY
        action = self.fire(LeaseEvent.RENEWED if ok else LeaseEvent.RENEW_REFUSED)
        if ok and was_primary:
            self._renewed_ms = started_ms
        return action

    def fenced(self) -> Action:
        """A data commit was refused: a newer primary exists."""
        return self.fire(LeaseEvent.FENCED)

    def stop(self) -> Action:
        return self.fire(LeaseEvent.STOP)
