"""Several frames in one message of a Session stream.

A gRPC message costs a hop about 100 us of CPU to read or write on this
project's machines whatever it holds (a grpc.aio echo of 64-byte messages:
226-346 us of server CPU a message in and its answer out; `python -m
taproot_ops.bench.grpc_cost --bundle`), against a few us to copy a 50 KiB
frame. So a stream writes every frame it has queued for its peer at that
moment as one message, a `FrameBundle`, when there is more than one. Nothing
waits to fill a bundle: a frame alone in the queue goes alone, at once.

The frames themselves are untouched: each keeps its bytes, its order and its
meaning, and the reader handles them one by one as if each had come alone. A
hop never opens, splits or merges a frame to bundle it.

Only a peer that reads bundles is sent them. The caller of a Session says so
in its call metadata (`BUNDLES_KEY`); the server says so in its initial
metadata. An older peer, which says neither, is written one frame a message.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from protocol import pb

BUNDLES_KEY = "taproot-bundles"
BUNDLES_METADATA = ((BUNDLES_KEY, "1"),)
# The frames' bytes one bundle carries at most (a frame of this size or more
# goes alone): past a megabyte, copying frames into a bundle costs about what
# the messages it saves would.
BUNDLE_MAX_BYTES = 1 << 20
# The frames a writer takes from its queue at once.
TAKE_MAX_FRAMES = 1024


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_BUNDLE_TAG = _varint((pb.Frame.BUNDLE_FIELD_NUMBER << 3) | 2)         # length-delimited
_FRAME_TAG = _varint((pb.FrameBundle.FRAMES_FIELD_NUMBER << 3) | 2)


def encode(frames: Sequence[bytes]) -> bytes:
    """The serialized frames as one serialized `Frame(bundle=...)`: the bytes
    protobuf would write for it, made by joining them once."""
    parts: list[bytes] = []
    inner = 0
    for data in frames:
        size = _varint(len(data))
        parts += (_FRAME_TAG, size, data)
        inner += len(_FRAME_TAG) + len(size) + len(data)
    return b"".join((_BUNDLE_TAG, _varint(inner), *parts))


def pack(frames: Sequence[bytes]) -> Iterator[bytes]:
    """The messages that carry `frames` (serialized, in order): runs of them
    as bundles of at most `BUNDLE_MAX_BYTES`, a frame alone where it is the
    only one of its run (or too large to share)."""
    run: list[bytes] = []
    size = 0
    for data in frames:
        if run and size + len(data) > BUNDLE_MAX_BYTES:
            yield run[0] if len(run) == 1 else encode(run)
            run, size = [], 0
        run.append(data)
        size += len(data)
    if run:
        yield run[0] if len(run) == 1 else encode(run)


def unbundled(message: pb.Frame) -> Sequence[pb.Frame]:
    """The frames one message of a stream carries, in order: its bundle's,
    or itself. A bundle inside a bundle is passed on as a frame, which a
    role refuses as it refuses any frame it does not take from a peer."""
    if message.WhichOneof("body") == "bundle":
        frames: Sequence[pb.Frame] = message.bundle.frames
        return frames
    return (message,)


def offered(metadata: Iterable[tuple[str, object]] | None) -> bool:
    """Whether a peer's call or initial metadata says it reads bundles."""
    return any(key == BUNDLES_KEY for key, _ in metadata or ())


class StreamCounts:
    """Messages and frames the process's Session streams have read and
    written (a role's `/metrics`: `taproot_stream_messages_total` and
    `taproot_stream_frames_total`); frames over messages is what bundling
    saves. Counted on the gRPC event loop's thread, which reads and writes
    every stream of a server (`protocol.stream.event_loop`)."""

    __slots__ = ("messages_in", "frames_in", "messages_out", "frames_out")

    def __init__(self) -> None:
        self.messages_in = self.frames_in = self.messages_out = self.frames_out = 0

    def read(self, message: pb.Frame) -> Sequence[pb.Frame]:
        """The frames a message read from a stream carries (`unbundled`), counted."""
        frames = unbundled(message)
        self.messages_in += 1
        self.frames_in += len(frames)
        return frames


STREAMS = StreamCounts()
