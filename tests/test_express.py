"""The express lane's pure core: GUID history, app targets, reconciliation."""

from __future__ import annotations

from primary.express import KIND_APPS, KIND_DEDUP, AppRules, Delivered, GuidHistory, Reconciler

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


def test_rebuilt_history_sees_the_guids_of_an_earlier_primary():
    history = GuidHistory(window_us=10 * S)
    history.load([(G[0], 1 * S), (G[1], 2 * S), (G[0], 3 * S)])
    assert history.commit([G[0], G[1], G[2]], now_us=5 * S) == [True, True, False]
    history.expire(12 * S)
    assert G[0] not in history and G[1] in history


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
