"""The express lane's decisions and their reconciliation with the pipeline: no I/O.

Right after a PUT group is committed the primary decides, for each row, what
the pipeline will decide a few seconds later, and pushes at once:

- `GuidHistory`: is the GUID a duplicate? BlazingMQ's rule, as the pipeline's
  `dropDuplicatesWithinWatermark` applies it: a GUID committed again within the
  history window of its first commit is a duplicate (ACKed, never pushed). One
  history per partition, like the pipeline's query, with the partition's
  longest domain window (`ClusterConfig.history_window_ms`). Time is the
  primary's commit time (`put_time`), the pipeline's event time.
- `target_apps`: which apps get it: the domain's apps whose application
  subscription matches (all of them without one), the same expression the
  pipeline renders as Spark SQL (`protocol/expression.py`, which holds both
  back ends to one semantics).

Spark stays the authority. `Reconciler` keeps each express decision until the
pipeline's delivery log has judged that row, then compares:

- a delivery row with apps the express lane did not push to (it judged the
  GUID a duplicate with a history rebuilt short, or a domain change reached
  the pipeline first) is pushed to those apps then ("late");
- an express push the pipeline does not keep (no delivery row once the
  pipeline has judged past that seq: it dropped a duplicate; or fewer apps) is
  a disagreement;
- every difference is a `Disagreement`, with both decisions, which the primary
  logs and writes to the partition's disagreements table.

Rows of `delivery = "pipeline"` domains get no express decision: they are
pushed when their delivery row arrives, as before the express lane.

Bounds: the history holds the GUIDs of one window; the reconciler holds at
most `decisions_max` decisions. Past that (a pipeline stopped for long), the
oldest are forgotten: their rows are taken as pushed when they arrive, and
counted (`forgotten`), so memory stays flat however far the pipeline lags.

Not thread safe: the partition serialises access (`Partition._decisions_lock`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from protocol.expression import Expression, compile_expression

DECISIONS_MAX = 2_000_000
KIND_DEDUP = "dedup"      # one side judged the GUID a duplicate, the other did not
KIND_APPS = "apps"        # both kept it, for different apps


class GuidHistory:
    """GUIDs first committed within the last `window_us` microseconds."""

    def __init__(self, window_us: int):
        assert window_us > 0
        self.window_us = window_us
        self._first: dict[bytes, int] = {}                 # guid -> first commit time
        self._commits: deque[tuple[int, list[bytes]]] = deque()   # (time, guids first seen then), in time order

    def __len__(self) -> int:
        return len(self._first)

    def __contains__(self, guid: bytes) -> bool:
        return guid in self._first

    def commit(self, guids: Iterable[bytes], now_us: int) -> list[bool]:
        """Record one commit's GUIDs (in seq order); return, per row, whether it
        is a duplicate: first committed within the window, earlier or in this
        same commit."""
        self.expire(now_us)
        first = self._first
        fresh: list[bytes] = []
        duplicates = []
        for guid in guids:
            if guid in first:
                duplicates.append(True)
            else:
                first[guid] = now_us
                fresh.append(guid)
                duplicates.append(False)
        if fresh:
            self._commits.append((now_us, fresh))
        return duplicates

    def load(self, first_times: Iterable[tuple[bytes, int]]) -> None:
        """Rebuild from the PUT log after a takeover: (guid, first put time) in time order."""
        for guid, at_us in first_times:
            if guid not in self._first:
                self._first[guid] = at_us
                if self._commits and self._commits[-1][0] == at_us:
                    self._commits[-1][1].append(guid)
                else:
                    self._commits.append((at_us, [guid]))

    def expire(self, now_us: int) -> None:
        horizon = now_us - self.window_us
        commits, first = self._commits, self._first
        while commits and commits[0][0] < horizon:
            for guid in commits.popleft()[1]:
                del first[guid]


class AppRules:
    """A domain's application subscriptions, compiled once per domain config."""

    def __init__(self, apps: Sequence[str], subscriptions: Mapping[str, str]):
        self.apps = tuple(apps)
        self._rules: list[tuple[str, Expression | None]] = [
            (app, compile_expression(subscriptions[app]) if app in subscriptions else None) for app in apps]
        self.filtered = any(rule is not None for _, rule in self._rules)

    def target_apps(self, properties: Callable[[], Mapping[str, object]]) -> tuple[str, ...]:
        """The apps a message goes to. `properties()` gives its typed
        properties; called only when some app has a subscription."""
        if not self.filtered:
            return self.apps
        props = properties()
        return tuple(app for app, rule in self._rules if rule is None or rule.matches(props))


@dataclass(frozen=True)
class Disagreement:
    key: Any                               # the caller's queue handle (the partition's QueueState)
    guid: bytes
    seq: int
    express_apps: tuple[str, ...] | None   # None: judged a duplicate
    pipeline_apps: tuple[str, ...] | None  # None: no delivery row (a duplicate)
    late_apps: tuple[str, ...]             # pushed when the delivery row came

    @property
    def kind(self) -> str:
        return KIND_DEDUP if (self.express_apps is None) != (self.pipeline_apps is None) else KIND_APPS

    def describe(self) -> str:
        def side(apps: tuple[str, ...] | None) -> str:
            if apps is None:
                return "duplicate"
            return "apps [" + ", ".join(repr(a) for a in apps) + "]"
        late = f"; pushed late to {list(self.late_apps)}" if self.late_apps else ""
        return f"seq {self.seq} guid {self.guid.hex()}: express {side(self.express_apps)}, " \
               f"pipeline {side(self.pipeline_apps)}{late}"


@dataclass(frozen=True)
class Delivered:
    """What to do with one delivery row: push it to `push_apps` (all its apps
    when the express lane never decided it; the missing ones when it did)."""
    seq: int
    push_apps: tuple[str, ...]
    disagreement: Disagreement | None


class Reconciler:
    def __init__(self, decisions_max: int = DECISIONS_MAX):
        self.decisions_max = decisions_max
        self._decisions: dict[int, tuple[Any, bytes, tuple[str, ...] | None]] = {}
        self._order: deque[int] = deque()    # seqs in decision order (ascending)
        self.forgotten_through = -1          # decisions up to this seq were dropped for the bound
        self.forgotten = 0
        self.agreed = 0
        self.disagreed = 0

    def __len__(self) -> int:
        return len(self._decisions)

    def decided(self, seq: int, key: Any, guid: bytes, apps: tuple[str, ...] | None) -> None:
        """The express lane's decision for one committed row: the apps it
        pushed to, or None for a duplicate. Rows come in ascending seq."""
        self._decisions[seq] = (key, guid, apps)
        self._order.append(seq)
        while len(self._order) > self.decisions_max:
            old = self._order.popleft()
            if self._decisions.pop(old, None) is not None:
                self.forgotten_through = max(self.forgotten_through, old)
                self.forgotten += 1

    def delivered(self, seq: int, apps: Sequence[str], express_domain: bool) -> Delivered | None:
        """A delivery row: the pipeline kept `seq` for `apps`. None when there
        is nothing to do (the common case: the express lane decided the same,
        so this allocates nothing; a pipeline batch brings 100,000 rows)."""
        decision = self._decisions.pop(seq, None)
        if decision is None:
            if express_domain and seq <= self.forgotten_through:
                return None   # decided, then forgotten: taken as pushed
            return Delivered(seq, tuple(apps), None)  # never decided here: the pipeline's call
        pushed = decision[2]
        if pushed is not None and len(pushed) == len(apps) and (
                all(a == b for a, b in zip(pushed, apps)) or set(pushed) == set(apps)):
            self.agreed += 1
            return None
        key, guid, _ = decision
        kept = tuple(apps)
        late = tuple(a for a in kept if pushed is None or a not in pushed)
        self.disagreed += 1
        return Delivered(seq, late, Disagreement(key, guid, seq, pushed, kept, late))

    def judged_through(self, seq_bound: int) -> list[Disagreement]:
        """The pipeline has judged every row up to `seq_bound`: a decision
        still held there got no delivery row, so the pipeline dropped it as
        a duplicate."""
        found = []
        order, decisions = self._order, self._decisions
        while order and order[0] <= seq_bound:
            seq = order.popleft()
            decision = decisions.pop(seq, None)
            if decision is None:
                continue  # its delivery row came
            key, guid, pushed = decision
            if pushed is None:
                self.agreed += 1
            else:
                self.disagreed += 1
                found.append(Disagreement(key, guid, seq, pushed, None, ()))
        return found
