"""Seq ranges: what CONFIRM frames and PUSH frame headers carry."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from protocol import pb, seqs


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


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 2**40), st.integers(1, 5)), max_size=60),
       st.booleans())
def test_a_confirm_frames_seqs_by_queue_are_its_ranges_expanded_in_the_frames_order(ranges, one_queue):
    if one_queue or not ranges:   # (no queue_ids: the frame is `queue_id`'s)
        frame = pb.ConfirmColumns(queue_id=7, starts=[s for _, s, _ in ranges], counts=[c for _, _, c in ranges])
        expected = {7: [q for _, s, c in ranges for q in range(s, s + c)]}
    else:
        frame = pb.ConfirmColumns(queue_ids=[q for q, _, _ in ranges], starts=[s for _, s, _ in ranges],
                                  counts=[c for _, _, c in ranges])
        expected = {}
        for queue_id, start, count in ranges:
            expected.setdefault(queue_id, []).extend(range(start, start + count))
    assert seqs.confirm_columns_invalid(frame) is None
    assert seqs.confirm_seqs(frame) == expected
