"""Seq ranges: what CONFIRM frames and PUSH frame headers carry."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from protocol import seqs


@given(st.lists(st.integers(0, 2**40), max_size=200))
def test_ranges_name_every_seq_in_order_and_merge_only_consecutive_ones(values):
    for given_as in (values, np.asarray(values, dtype=np.int64)):
        starts, counts = seqs.ranges(given_as)
        assert seqs.expand(starts, counts) == values
        assert all(c >= 1 for c in counts)
        # a range ends where the next seq is not the one after it
        ends = [s + c - 1 for s, c in zip(starts, counts)]
        assert all(nxt != end + 1 for end, nxt in zip(ends, starts[1:]))


def test_a_run_of_a_thousand_is_one_range():
    assert seqs.ranges(list(range(5, 1005))) == ([5], [1000])
    assert seqs.ranges([]) == ([], [])
