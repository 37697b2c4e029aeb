"""The per-seq reconciler that `primary.express.Reconciler` (runs, and
delivery rows a batch at a time) replaced, kept as the oracle of its
property test (`tests/test_express.py`): one dict entry per decision."""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from primary.express import Delivered, Disagreement

DECISIONS_MAX = 2_000_000


class PerSeqReconciler:
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
