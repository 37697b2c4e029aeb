"""The replica's forwarding: what of a frame goes to another partition's
primary and what stays with this node."""

from __future__ import annotations

from typing import Any

from protocol import pb
from protocol.retransmit import RetransmissionLimits
from replicas.forwarding import Forwarding


class FakeUpstream:
    def __init__(self) -> None:
        self.frames: list[tuple[Any, pb.Frame]] = []

    def on_frame(self, link: Any, frame: pb.Frame) -> None:
        self.frames.append((link, frame))


def forwarding_with(relayed: dict[int, FakeUpstream], link: str = "L") -> Forwarding:
    forwarding = Forwarding(lambda p: [], "test", RetransmissionLimits())
    forwarding._relayed[link] = relayed
    return forwarding


def test_a_confirm_frame_of_several_queues_is_split_by_primary_and_the_rest_stays():
    p1, p2 = FakeUpstream(), FakeUpstream()
    forwarding = forwarding_with({3: p1, 4: p2, 5: p1})
    frame = pb.Frame(confirm_columns=pb.ConfirmColumns(
        starts=[10, 20, 30, 40, 50], counts=[1, 2, 3, 4, 5], queue_ids=[3, 1, 4, 5, 2]))
    local = forwarding.split("L", frame)
    assert local is not None and local.confirm_columns == pb.ConfirmColumns(
        starts=[20, 50], counts=[2, 5], queue_ids=[1, 2])
    assert [f.confirm_columns for _, f in p1.frames] == [pb.ConfirmColumns(starts=[10, 40], counts=[1, 4],
                                                                           queue_ids=[3, 5])]
    assert [f.confirm_columns for _, f in p2.frames] == [pb.ConfirmColumns(starts=[30], counts=[3], queue_ids=[4])]
    # Everything relayed: nothing stays.
    assert forwarding.split("L", pb.Frame(confirm_columns=pb.ConfirmColumns(
        starts=[1], counts=[1], queue_ids=[4]))) is None
    # Nothing relayed, or malformed: the frame stays whole (the node answers a malformed one).
    for whole in (pb.ConfirmColumns(starts=[1, 2], counts=[1, 1], queue_ids=[1, 2]),
                  pb.ConfirmColumns(starts=[1, 2], counts=[1, 1], queue_ids=[3])):
        frame = pb.Frame(confirm_columns=whole)
        assert forwarding.split("L", frame) is frame


def test_a_put_frame_of_several_queues_goes_whole_to_their_primary_or_stays():
    p1, p2 = FakeUpstream(), FakeUpstream()
    forwarding = forwarding_with({3: p1, 4: p1, 5: p2})
    relayed = pb.Frame(put_columns=pb.PutColumns(arrow_ipc=b"rows", per_message=True, queue_ids=[3, 4, 3]))
    assert forwarding.split("L", relayed) is None
    assert p1.frames == [("L", relayed)] and p2.frames == []
    for stays in ([1, 2], [3, 5], [3, 1]):   # served here; two primaries; mixed: the node refuses those two
        frame = pb.Frame(put_columns=pb.PutColumns(arrow_ipc=b"rows", per_message=True, queue_ids=stays))
        assert forwarding.split("L", frame) is frame
    assert len(p1.frames) == 1 and p2.frames == []
