"""Payload compression, done in the SDK only (BlazingMQ's rule): the broker
stores and forwards the compressed bytes and never looks inside. Properties are
not compressed, so subscriptions still see them.

As in BlazingMQ the choice is a hint: payloads under `MIN_BYTES` are sent as
they are, and so is a payload that compression would not make smaller. The
message records what was actually done (`Message.compression` on the consumer
side, the `compression` column in the tables).
"""

from __future__ import annotations

import zlib

import zstandard

from protocol import pb
from protocol.codes import COMPRESSION_CODES, COMPRESSION_NAMES

MIN_BYTES = 1024
ALGORITHMS = COMPRESSION_CODES
NAMES = COMPRESSION_NAMES
_zstd_c = zstandard.ZstdCompressor(level=3)
_zstd_d = zstandard.ZstdDecompressor()


def compress(payload: bytes, algorithm: str | None) -> tuple[bytes, int]:
    """(wire payload, wire compression code)."""
    if algorithm is None:
        return payload, pb.COMPRESSION_NONE
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown compression {algorithm!r}; use one of {', '.join(ALGORITHMS)} or None")
    if len(payload) < MIN_BYTES:
        return payload, pb.COMPRESSION_NONE
    packed = zlib.compress(payload, 6) if algorithm == "zlib" else _zstd_c.compress(payload)
    if len(packed) >= len(payload):
        return payload, pb.COMPRESSION_NONE
    return packed, ALGORITHMS[algorithm]


def decompress(payload: bytes, code: int) -> bytes:
    """Raise ValueError if the payload does not decompress."""
    try:
        if code == pb.COMPRESSION_NONE:
            return payload
        if code == pb.COMPRESSION_ZLIB:
            return zlib.decompress(payload)
        if code == pb.COMPRESSION_ZSTD:
            # The frame header carries the size; streaming covers frames without one.
            return _zstd_d.decompressobj().decompress(payload)
    except (zlib.error, zstandard.ZstdError) as exc:
        raise ValueError(f"{NAMES.get(code, code)} payload does not decompress: {exc}") from exc
    raise ValueError(f"unknown compression code {code}")
