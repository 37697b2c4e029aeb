"""A consumer's held rows as spans (`primary.held.HeldRows`) against the
dict of seq -> held message in push order it replaced (the oracle), fed the
same random operations."""

from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primary.dispatcher import MessageRun, StoredMessage
from primary.held import HeldRows

SEQS = 90   # small, so runs interleave with each other and with single messages


def _guid(seq: int) -> bytes:
    return seq.to_bytes(16, "big")


def _size(seq: int) -> int:
    return 1 + seq % 7


def _run(seqs: list[int]) -> MessageRun:
    return MessageRun(pa.table({"seq": pa.array(seqs, pa.int64())}), [_guid(s) for s in seqs], list(seqs),
                      [_size(s) for s in seqs])


def _single(seq: int, tag: int) -> StoredMessage:
    return StoredMessage(_guid(seq), seq, b"x" * _size(seq), put_time_us=tag)


def _same(held: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return isinstance(held, tuple) and held[0] is want[0] and held[1] == want[1]
    return held is want


operations = st.lists(st.one_of(
    st.tuples(st.just("run"), st.integers(0, SEQS - 1), st.integers(1, 30), st.sampled_from([1, 1, 2, 5, -1])),
    st.tuples(st.just("single"), st.integers(0, SEQS - 1)),
    st.tuples(st.just("pop"), st.integers(0, SEQS + 5)),
    st.tuples(st.just("get"), st.integers(0, SEQS + 5)),
    st.tuples(st.just("range"), st.integers(-3, SEQS), st.integers(1, 40)),
    st.tuples(st.just("clear"))), max_size=60)


@pytest.mark.unit
@settings(deadline=None)
@given(operations)
def test_held_rows_are_the_dict_they_replace(ops: list[tuple[Any, ...]]) -> None:
    """Runs of consecutive seqs or with gaps (a run whose seq interval meets
    another's goes in row by row, as does one out of order, even between
    first and last seqs in order), single
    messages set and set again in
    place, pops and gets of held and unheld seqs, seq ranges taken (GUIDs,
    seqs ascending, bytes), and clears: after each, the same (seq, held) in
    the same push order, and the same length."""
    held, model = HeldRows(), OrderedDict[int, Any]()
    for n, op in enumerate(ops):
        kind = op[0]
        if kind == "run":
            _, start, count, step = op
            seqs = [s for s in range(start, start + count * abs(step), abs(step)) if s < SEQS and s not in model]
            if not seqs:
                continue
            if step == 5:   # (out of order: held row by row)
                seqs.reverse()
            if step == -1 and len(seqs) >= 4:   # (out of order between ends in order: held row by row too)
                seqs[1], seqs[2] = seqs[2], seqs[1]
            run = _run(seqs)
            held.add_run(run)
            model.update((s, (run, i)) for i, s in enumerate(seqs))
        elif kind == "single":
            seq = op[1]
            if seq in model and isinstance(model[seq], tuple):
                continue   # (a row of a run is not set again: the dispatcher never does)
            message = _single(seq, n)
            held[seq] = message
            model[seq] = message
        elif kind == "pop":
            want = model.pop(op[1], None)
            got = held.pop(op[1])
            assert (got is None) if want is None else _same(got, want)
        elif kind == "get":
            want = model.get(op[1])
            got = held.get(op[1])
            assert (got is None) if want is None else _same(got, want)
            assert (op[1] in held) == (want is not None)
        elif kind == "range":
            _, first, count = op
            seqs = [s for s in range(first, first + count) if s in model]
            for s in seqs:
                del model[s]
            assert held.take_range(first, count) == ([_guid(s) for s in seqs], seqs, sum(map(_size, seqs)))
        else:
            held.clear()
            model.clear()
        assert len(held) == len(model) and bool(held) == bool(model)
        items = list(held.items())
        assert [s for s, _ in items] == list(model) == list(held)
        assert all(_same(h, model[s]) for s, h in items)
