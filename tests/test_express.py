"""The express lane's pure core: GUID history, app targets, reconciliation."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primary.express import KIND_APPS, KIND_DEDUP, AppRules, Delivered, GuidHistory, Reconciler, inline
from tests.reconciler_oracle import PerSeqReconciler

G = [bytes([i]) * 16 for i in range(10)]
S = 1_000_000  # one second in microseconds


def test_a_guid_seen_within_the_window_is_a_duplicate_and_after_it_is_not():
    history = GuidHistory(window_us=10 * S)
    assert history.commit([G[0], G[1]], now_us=0) == [False, False]
    assert history.commit([G[1], G[2]], now_us=9 * S) == [True, False]
    # The window runs from the first commit: a repeat does not extend it.
    assert history.commit([G[1]], now_us=10 * S) == [True]
    assert history.commit([G[0], G[1]], now_us=10 * S + 1) == [False, False]
    assert len(history) == 3


def test_a_guid_twice_in_one_commit_is_a_duplicate_the_second_time():
    history = GuidHistory(window_us=S)
    assert history.commit([G[3], G[3], G[4]], now_us=5) == [False, True, False]


def test_history_memory_is_bounded_by_the_window():
    history = GuidHistory(window_us=10 * S)
    for second in range(100):
        history.commit([bytes([second]) * 16], now_us=second * S)
    assert len(history) == 11   # seconds 89..99


def test_a_young_table_that_fills_is_frozen_early_and_the_next_is_larger_and_never_rehashed():
    """The young GUIDs are in NumPy arrays, looked up and added for a whole
    commit at once. A table that fills before its span is over is frozen
    then (its generation built on a thread of its own) and the next one is
    made twice as large: no table ever rehashes what it holds. Lookups,
    repeats, expiry and the count work across the tables and generations,
    for GUIDs that differ in one byte only."""
    from primary import express

    history = GuidHistory(window_us=10 * S, young_min=2048)
    guids = [i.to_bytes(2, "big") + bytes(14) for i in range(20_000)]
    assert history._young.capacity == 2048 and GuidHistory(S)._young.capacity == express._YOUNG_MIN
    assert history.commit(guids[:10_000], now_us=0) == [False] * 10_000
    assert history._young.count == 10_000 and history._generations == deque()   # made as large as the commit
    first = history._young
    assert history.commit(guids[5_000:15_000], now_us=1) == [True] * 5_000 + [False] * 5_000
    # Full: frozen early, the 5,000 new ones in a table twice as large.
    assert history._young is not first and history._young.capacity == 2 * first.capacity
    assert history._young.count == 5_000 and [len(g) for g in history._generations] == [10_000]
    assert len(history) == 15_000 and guids[14_999] in history and guids[15_000] not in history
    history.settle()
    assert isinstance(history._generations[0], express._Generation) and guids[0] in history
    history.expire(now_us=10 * S + 1)   # the first commit's 10,000 leave the window; the young is frozen
    assert len(history) == 5_000 and guids[0] not in history and guids[10_000] in history
    assert history._young.count == 0 and [len(g) for g in history._generations] == [5_000]
    assert history.commit(guids[:2] + guids[15_000:], now_us=10 * S + 1) == [False] * 5_002
    assert len(history) == 10_002


def test_the_young_tables_of_a_first_span_make_one_generation_however_often_they_fill():
    """A young table starts small and doubles each time it fills before its
    span is over; the tables frozen that way are merged into the
    generation before, so a first span at full speed leaves one generation
    to search, not one per doubling."""
    history = GuidHistory(window_us=16 * S, spawn=on_a_thread, young_min=2048)   # a span a second
    guids = [(i * 7919).to_bytes(16, "big") for i in range(100_000)]
    for ms in range(100):                                    # 100,000 GUIDs in 0.1 s
        assert history.commit(guids[ms * 1000:(ms + 1) * 1000], ms * 1000) == [False] * 1000
    history.settle()
    assert len(history._generations) == 1 and len(history) == 100_000
    assert len(history._generations[0]) + history._young.count == 100_000
    assert history.commit(guids[::997] + [b"\xff" * 16], 200_000) == [True] * len(guids[::997]) + [False]


def test_the_history_gives_the_garbage_collector_nothing_per_guid_to_traverse():
    """A full window holds millions of GUIDs: held in lists, every full
    collection walked them all (75 ms at 6M, with every thread stopped)."""
    import gc
    import types

    def references_walked(root: object) -> int:
        """The references a full collection follows from `root` (through
        the objects it tracks)."""
        seen, stack, edges = set(), [root], 0
        while stack:
            obj = stack.pop()
            if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, (type, types.FunctionType)):
                continue   # (its classes and functions are shared, not the history's)
            seen.add(id(obj))
            referents = gc.get_referents(obj)
            edges += len(referents)
            stack.extend(referents)
        return edges

    history = GuidHistory(window_us=10**12)
    for commit in range(100):
        history.commit([(commit * 1000 + i).to_bytes(16, "big") for i in range(1000)], now_us=commit)
    history.load([((10**6 + i).to_bytes(16, "big"), 200 + i // 100) for i in range(10_000)])
    assert len(history) == 110_000
    gc.collect()   # (which stops tracking a dict of atomic keys and values, as every collection does)
    assert references_walked(history) < 2_000   # a few per commit, none per GUID
    history.expire(10**12 + 150)
    assert len(history) == 10_000 and (10**6).to_bytes(16, "big") in history


def test_rebuilt_history_sees_the_guids_of_an_earlier_primary():
    history = GuidHistory(window_us=10 * S)
    history.load([(G[0], 1 * S), (G[1], 2 * S), (G[0], 3 * S)])
    assert history.commit([G[0], G[1], G[2]], now_us=5 * S) == [True, True, False]
    history.expire(12 * S)
    assert G[0] not in history and G[1] in history


def on_a_thread(task):
    """A `Spawn` as a primary's: the build on a thread, and its join to wait."""
    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    return thread.join


class NaiveHistory:
    """The GUID history's rule, one dict of first commit times: the oracle."""

    def __init__(self, window_us: int):
        self.window_us, self.first, self.horizon = window_us, {}, None

    def commit(self, guids, now_us):
        self.expire(now_us)
        out = []
        for g in guids:
            if g in self.first:
                out.append(True)
            else:
                self.first[g] = now_us
                out.append(False)
        return out

    def expire(self, now_us):
        self.horizon = now_us - self.window_us
        self.first = {g: t for g, t in self.first.items() if t >= self.horizon}


def history_schedules():
    """Commits at non-decreasing times (some far apart: whole generations
    leave), of GUIDs drawn from a small pool (repeats, in and out of the
    window, and twice in one commit); a few share their first 8 bytes or
    differ in one byte only."""
    pool = [i.to_bytes(16, "big") for i in range(12)] + [bytes(8) + i.to_bytes(8, "big") for i in range(6)] + [
        b"\x01" * 8 + bytes(8)]
    step = st.tuples(st.integers(0, 2_500), st.lists(st.sampled_from(pool), max_size=8), st.booleans())
    return st.tuples(st.sampled_from([1_000, 3_200, 16_000]), st.lists(step, max_size=60))


@settings(deadline=None, max_examples=2 * settings().max_examples)   # twice the tier's (conftest)
@given(history_schedules(), st.sampled_from([None, (1, 4), (2, 16)]), st.booleans())
def test_the_generational_history_decides_as_one_dict_of_first_times_would(schedule, young, threads):
    """Also with young tables of a few GUIDs, which fill early and are merged
    with the generation before, and with generations built on threads of
    their own (lookups meanwhile go to the tables they are built from), as
    a primary builds them."""
    window_us, steps = schedule
    sizes = {} if young is None else {"young_min": young[0], "young_max": young[1]}
    history = GuidHistory(window_us, seed=bytes(range(16)), spawn=on_a_thread if threads else inline, **sizes)
    oracle = NaiveHistory(window_us)
    now = 0
    for advance, guids, expire_only in steps:
        now += advance
        if expire_only:
            history.expire(now)
            oracle.expire(now)
        else:
            assert history.commit(guids, now) == oracle.commit(guids, now)
        assert len(history) == len(oracle.first)
        for g in set(guids):
            assert (g in history) == (g in oracle.first)


def test_older_guids_are_frozen_into_generations_of_34_bytes_each():
    from primary import express

    history = GuidHistory(window_us=16 * S)              # a generation a second
    for second in range(20):
        assert history.commit([(second * 1000 + i).to_bytes(16, "big") for i in range(1000)], second * S) == \
            [False] * 1000
    # Seconds 3..18 frozen, a generation each (0..2 have left the window), second 19 young.
    history.settle()
    assert len(history._generations) == 16 and history._young.count == 1000
    assert len(history) == 17_000
    assert all(g.h.nbytes + g.hi.nbytes + g.lo.nbytes + g.t.nbytes == 32 * len(g) and g.words.nbytes <= 2 * len(g) + 8
               for g in history._generations)
    # What `taproot_express_history_bytes` reports: the generations' 34 bytes a
    # GUID and the young table's arrays for its capacity.
    young = history._young
    assert young.nbytes == young.capacity * 24 + young.hashes.size * 12 + young.used.size
    assert 16 * 1000 * 32 + young.nbytes < history.nbytes <= 16 * (1000 * 34 + 8) + young.nbytes
    assert history.commit([(17_000).to_bytes(16, "big"), (3_000).to_bytes(16, "big")], 20 * S) == [True, False]
    assert len(history._generations) <= express.GENERATIONS + 1


def test_app_rules_pick_the_apps_whose_subscription_matches():
    rules = AppRules(["all", "eu", "big"], {"eu": "region = 'EU'", "big": "amount > 100"})
    assert rules.target_apps(lambda: {"region": "EU", "amount": 500}) == ("all", "eu", "big")
    assert rules.target_apps(lambda: {"region": "US", "amount": 5}) == ("all",)
    assert rules.target_apps(lambda: {"region": "EU", "amount": "lots"}) == ("all", "eu")   # unknown is not true


def test_app_rules_without_subscriptions_never_read_properties():
    def boom():
        raise AssertionError("properties read")
    assert AppRules([""], {}).target_apps(boom) == ("",)


def test_a_delivery_row_that_agrees_pushes_nothing_more():
    r = Reconciler()
    r.decided(1, "q", G[1], ("a", "b"))
    assert r.delivered(1, ["b", "a"], express_domain=True) is None
    assert r.judged_through(1) == [] and (r.agreed, r.disagreed) == (1, 0)


def test_a_row_the_express_lane_judged_a_duplicate_is_pushed_when_the_pipeline_keeps_it():
    r = Reconciler()
    r.decided(1, "q", G[1], None)
    outcome = r.delivered(1, [""], express_domain=True)
    assert outcome is not None and outcome.push_apps == ("",)
    d = outcome.disagreement
    assert d is not None and d.kind == KIND_DEDUP and d.express_apps is None and d.late_apps == ("",)


def test_an_express_push_without_a_delivery_row_is_a_disagreement_once_the_pipeline_passed_it():
    r = Reconciler()
    r.decided(1, "q", G[1], ("",))
    r.decided(2, "q", G[2], None)
    r.decided(3, "q", G[3], ("",))
    assert r.judged_through(0) == []
    found = r.judged_through(2)
    assert [(d.seq, d.kind, d.express_apps, d.pipeline_apps) for d in found] == [(1, KIND_DEDUP, ("",), None)]
    assert len(r) == 1   # seq 3 waits for its row


def test_different_apps_push_the_missing_ones_and_record_the_extra_ones():
    r = Reconciler()
    r.decided(5, "q", G[5], ("a", "b"))
    outcome = r.delivered(5, ["b", "c"], express_domain=True)
    assert outcome is not None and outcome.push_apps == ("c",)
    d = outcome.disagreement
    assert d is not None and d.kind == KIND_APPS and d.pipeline_apps == ("b", "c") and "express apps" in d.describe()


def test_rows_never_decided_are_the_pipelines_to_push():
    r = Reconciler()
    assert r.delivered(7, ["x"], express_domain=False) == Delivered(7, ("x",), None)
    assert r.delivered(8, ["x"], express_domain=True) == Delivered(8, ("x",), None)   # e.g. before a takeover


def test_decisions_are_bounded_and_forgotten_ones_are_taken_as_pushed():
    r = Reconciler(decisions_max=3)
    for seq in range(6):
        r.decided(seq, "q", G[seq], ("",))
    assert len(r) == 3 and r.forgotten == 3 and r.forgotten_through == 2
    assert r.delivered(1, [""], express_domain=True) is None                # forgotten: already pushed
    assert r.delivered(1, [""], express_domain=False) == Delivered(1, ("",), None)   # a pipeline domain's row
    assert r.delivered(4, [""], express_domain=True) is None


# -- runs against the per-seq oracle --------------------------------------------------------------
APPS = [None, ("",), ("a", "b"), ("b", "a"), ("a",), ("b", "c")]


@st.composite
def reconcile_schedules(draw):
    """A random life of a reconciler: decisions one by one and by run (with
    duplicates), delivery rows one by one and a batch at a time (some agree,
    some not, some never decided, some twice), the pipeline judging past
    rows, and sometimes a bound small enough to forget decisions."""
    decisions_max = draw(st.sampled_from([3, 10, 40, 10_000]))
    steps, next_seq = [], 0
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["one", "many", "run", "row", "rows", "judged"]))
        key = draw(st.sampled_from(["q1", "q2"]))
        if kind == "one":
            steps.append(("one", next_seq, key, draw(st.sampled_from(APPS))))
            next_seq += 1
        elif kind == "many":   # a spanning frame's rows: gaps (rows of other queues), keys mixed
            rows = []
            for _ in range(draw(st.integers(1, 12))):
                next_seq += draw(st.sampled_from([0, 0, 0, 1, 3]))
                rows.append((next_seq, draw(st.sampled_from(["q1", "q2", "q3"])), draw(st.sampled_from(APPS))))
                next_seq += 1
            steps.append(("many", rows))
        elif kind == "run":
            count = draw(st.integers(1, 30))
            apps = draw(st.sampled_from([a for a in APPS if a is not None]))
            dups = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=count, max_size=count)))
            steps.append(("run", next_seq, key, count, apps, dups))
            next_seq += count
        elif kind in ("row", "rows"):
            seqs = sorted(draw(st.lists(st.integers(0, next_seq + 3), max_size=40, unique=kind == "rows"
                                        or draw(st.booleans()))))
            apps = [list(draw(st.sampled_from([a for a in APPS if a is not None]))) for _ in seqs]
            express = [draw(st.booleans()) for _ in seqs]
            steps.append((kind, seqs, apps, express))
        else:
            steps.append(("judged", draw(st.integers(-1, next_seq))))
    return decisions_max, steps


def _guid(seq: int) -> bytes:
    return seq.to_bytes(16, "big")


@settings(deadline=None)
@given(reconcile_schedules())
def test_runs_reconcile_as_the_per_seq_reconciler_did(schedule):
    decisions_max, steps = schedule
    runs, oracle = Reconciler(decisions_max), PerSeqReconciler(decisions_max)
    runs.compact_min = 2   # the runs that left are dropped from the list often, not after 1,024
    for step in steps:
        if step[0] == "one":
            _, seq, key, apps = step
            runs.decided(seq, key, _guid(seq), apps)
            oracle.decided(seq, key, _guid(seq), apps)
        elif step[0] == "many":
            _, rows = step
            runs.decided_rows([q for q, _, _ in rows], [k for _, k, _ in rows], [_guid(q) for q, _, _ in rows],
                              [a for _, _, a in rows])
            for seq, key, apps in rows:
                oracle.decided(seq, key, _guid(seq), apps)
        elif step[0] == "run":
            _, first, key, count, apps, dups = step
            guids = pa.array([_guid(first + i) for i in range(count)], pa.binary())
            runs.decided_run(first, key, guids, apps, dups)
            for i in range(count):
                oracle.decided(first + i, key, _guid(first + i), None if dups and dups[i] else apps)
        elif step[0] == "row":
            _, seqs, apps, express = step
            for seq, a, e in zip(seqs, apps, express):
                assert runs.delivered(seq, a, e) == oracle.delivered(seq, a, e)
        elif step[0] == "rows":
            _, seqs, apps, express = step
            got = runs.delivered_rows(np.array(seqs, np.int64), pa.array(apps, pa.list_(pa.string())),
                                      np.array(express, np.bool_))
            expected = [(i, d) for i, (seq, a, e) in enumerate(zip(seqs, apps, express))
                        if (d := oracle.delivered(seq, a, e)) is not None]
            assert got == expected
        else:
            assert runs.judged_through(step[1]) == oracle.judged_through(step[1])
        assert (len(runs), runs.agreed, runs.disagreed, runs.forgotten, runs.forgotten_through) == (
            len(oracle), oracle.agreed, oracle.disagreed, oracle.forgotten, oracle.forgotten_through)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 0, 1, 4]), st.sampled_from(["q1", "q2"]), st.sampled_from(APPS)),
                max_size=30), st.sampled_from([None, "run", "row"]), st.integers(1, 3))
def test_decided_rows_makes_the_runs_a_decision_a_row_makes(rows, before, calls):
    """`decided_rows` (a spanning frame's decisions in one call, or in a few
    calls when the frame is cut by other decisions) builds the same runs,
    keys and open rows as `decided` row by row, after a frame's run, a run
    of rows, or nothing."""
    one, many = Reconciler(), Reconciler()
    for r in (one, many):
        if before == "run":
            r.decided_run(0, "q1", [_guid(i) for i in range(11)], ("",))
        elif before == "row":
            r.decided(10, "q2", _guid(10), ("",))
    seqs, seq = [], 11
    for gap, _, _ in rows:
        seq += gap
        seqs.append(seq)
        seq += 1
    for (_, key, apps), seq in zip(rows, seqs):
        one.decided(seq, key, _guid(seq), apps)
    cut = [len(rows) * n // calls for n in range(calls + 1)]
    for a, b in zip(cut, cut[1:]):
        many.decided_rows(seqs[a:b], [k for _, k, _ in rows[a:b]], [_guid(q) for q in seqs[a:b]],
                          [x for _, _, x in rows[a:b]])

    def shape(r):
        return [(run.first, run.end, run.key, run.keys, run.rows, list(run.guids), bytes(run.open))
                for run in r._runs], r._rows, len(r)

    assert shape(many) == shape(one)


def test_a_batch_of_rows_that_agree_with_a_frame_takes_no_per_row_path():
    r = Reconciler()
    guids = pa.array([_guid(i) for i in range(1000)], pa.binary())
    r.decided_run(0, "q", guids, ("a", "b"), [i == 7 for i in range(1000)])
    seqs = np.array([s for s in range(1000) if s != 7], np.int64)
    out = r.delivered_rows(seqs, pa.array([["a", "b"]] * len(seqs), pa.list_(pa.string())), np.ones(len(seqs), bool))
    assert out == [] and r.agreed == 999 and len(r) == 1
    assert r.judged_through(999) == [] and r.agreed == 1000 and len(r) == 0


def test_a_frames_decision_keeps_its_guids_alive_not_the_frames_bytes():
    """A decoded frame's columns share its body: a decision that kept the
    GUID column would keep every payload until the pipeline judged it."""
    import gc
    import sys

    from protocol import columns, pb

    data = columns.encode_puts([pb.PutMessage(guid=_guid(i), payload=b"p" * 1024) for i in range(100)])
    table = columns.decode(data)
    assert sys.getrefcount(data) == 3           # `data`, the call's argument, and the decoded table
    r = Reconciler()
    r.decided_run(0, "q", table["guid"], ("a",))
    del table
    gc.collect()
    assert sys.getrefcount(data) == 2           # the decision does not hold the frame
    late = r.delivered(5, ("a", "b"), True)     # the pipeline kept row 5 for one more app: a disagreement
    assert late.disagreement.guid == _guid(5) and late.push_apps == ("b",)


def test_row_decisions_of_many_queues_share_one_run_and_agree_without_the_per_row_path(monkeypatch):
    """A commit's rows, one or two a queue (thousands of queues): one run
    for the lot (a few objects for the garbage collector, not three a row),
    reconciled in one batch; a disagreement still names its own queue."""
    r = Reconciler()
    for seq in range(100):
        r.decided(seq, f"q{seq % 50}", _guid(seq), None if seq == 7 else ("",))
    assert len(r._runs) == 1 and r._runs[0].keys[:3] == ["q0", "q1", "q2"]
    seqs = np.array([s for s in range(100) if s not in (7, 42)], np.int64)
    monkeypatch.setattr(r, "delivered", lambda *a: pytest.fail("a row that agrees took the per-row path"))
    assert r.delivered_rows(seqs, pa.array([[""]] * len(seqs), pa.list_(pa.string())), np.ones(len(seqs), bool)) == []
    assert r.agreed == 98 and len(r) == 2
    monkeypatch.undo()
    out = r.delivered_rows(np.array([42], np.int64), pa.array([["", "x"]], pa.list_(pa.string())), np.ones(1, bool))
    assert [(i, d.disagreement.key, d.push_apps) for i, d in out] == [(0, "q42", ("x",))]
    assert [(d.key, d.seq) for d in r.judged_through(99)] == []   # seq 7 was a duplicate, and got no row
    assert r.agreed == 99 and r.disagreed == 1


@pytest.mark.parametrize("as_run", [False, True], ids=["rows", "run"])
def test_the_pipeline_keeping_another_copy_of_a_pushed_message_is_no_disagreement(as_run):
    """One message committed twice in one micro-batch (a mirrored PUT, a
    resend): the express lane pushed the first copy and judged the second a
    duplicate; Spark's dedup may keep either. When it keeps the second, the
    message went to the same apps: nothing is pushed again (a consumer would
    get it twice) and nothing is recorded."""
    g1, g2 = b"\x01" * 16, b"\x02" * 16
    reconciler = Reconciler()
    if as_run:   # a frame of 4 rows: rows 2 and 3 are copies of rows 0 and 1
        reconciler.decided_run(10, "q", pa.array([g1, g2, g1, g2], pa.binary()), ("",), [False, False, True, True])
    else:
        for seq, guid, apps in ((10, g1, ("",)), (11, g2, ("",)), (12, g1, None), (13, g2, None)):
            reconciler.decided(seq, "q", guid, apps)
    # Spark kept seq 12 (g1's second copy) and seq 11 (g2's first).
    seqs, apps = np.array([11, 12], np.int64), pa.array([[""], [""]], pa.list_(pa.string()))
    express = np.array([True, True])
    assert reconciler.delivered_rows(seqs, apps, express, pa.array([g2, g1], pa.binary())) == []
    assert reconciler.judged_through(13) == []
    assert (len(reconciler), reconciler.agreed, reconciler.disagreed) == (0, 4, 0)


def test_without_the_guids_a_kept_second_copy_is_still_pushed_late():
    """What the rule above changes: given no GUIDs, the pipeline's kept copy
    is pushed late and both sides of the difference are recorded."""
    g1 = b"\x01" * 16
    reconciler = Reconciler()
    reconciler.decided(10, "q", g1, ("",))
    reconciler.decided(11, "q", g1, None)
    (row, outcome), = reconciler.delivered_rows(np.array([11]), pa.array([[""]], pa.list_(pa.string())),
                                                np.array([True]))
    assert (row, outcome.seq, outcome.push_apps) == (0, 11, ("",))
    assert [d.seq for d in reconciler.judged_through(11)] == [10]


def test_a_copy_in_another_queue_is_not_the_same_message():
    """The same GUID posted to two queues (a producer's bug) is two messages
    to the express lane's rule above: the kept one is pushed late, as before."""
    g1 = b"\x01" * 16
    reconciler = Reconciler()
    reconciler.decided(10, "q1", g1, ("",))
    reconciler.decided(11, "q2", g1, None)
    (row, outcome), = reconciler.delivered_rows(np.array([11]), pa.array([[""]], pa.list_(pa.string())),
                                                np.array([True]), pa.array([g1], pa.binary()))
    assert (outcome.seq, outcome.push_apps) == (11, ("",))


def test_history_bytes_count_a_generation_being_built_with_the_tables_it_replaces():
    """While a generation is built on its thread, the young table it comes
    from is still looked up, so both take memory, and the bytes say so."""
    tasks: list = []

    def later(task):
        tasks.append(task)
        return lambda: [t() for t in tasks if t is task]

    history = GuidHistory(window_us=16 * S, spawn=later)   # a generation a second
    history.commit([i.to_bytes(16, "big") for i in range(1000)], 0)
    history.commit([(5000 + i).to_bytes(16, "big") for i in range(10)], S)   # second 0 is frozen: a build waits
    (freezing,) = history._generations
    building = history.nbytes
    assert building == freezing.parts[0].nbytes + history._young.nbytes
    tasks.pop()()                         # the build ends; its generation sits beside the table until taken
    assert history.nbytes == building + freezing.ready().nbytes
    history.settle()
    assert history.nbytes == freezing.ready().nbytes + history._young.nbytes < building
