"""Result codes: defined once (in `taproot.proto`), documented here.

| code | when |
|---|---|
| SUCCESS | the operation succeeded; for a PUT: durable in the partition's Delta log |
| UNKNOWN | outcome unknown, e.g. the link dropped after the PUT left the SDK |
| TIMEOUT | no answer within the deadline |
| NOT_CONNECTED | no route to the primary (the upstream link is down) |
| CANCELED | the request was cancelled because its session or queue closed |
| NOT_SUPPORTED | the queue's mode does not support the operation |
| REFUSED | the peer refused: unknown domain, queue not open for that access, node stopping |
| INVALID_ARGUMENT | malformed frame, bad queue URI, bad GUID, oversized payload, bad option |
| NOT_READY | the peer or partition is starting and cannot take the request yet |
| NO_ROUTE | `queue@cluster`: no federation link here carries the domain to that cluster (docs/federation.md) |
| UNAUTHENTICATED | `[auth]`: no token, or a token that is unknown, revoked or expired (docs/operations.md) |
| NOT_AUTHORIZED | `[auth]`: the token lacks the right the request needs; the message names it and the domain |
| LIMIT_MESSAGES | a message quota or buffer bound was reached |
| LIMIT_BYTES | a byte quota or buffer bound was reached |
| STORAGE_FAILURE | the Delta commit failed; the PUT was not persisted |

Numeric values match BlazingMQ's where BlazingMQ has them and never change.
"""

from __future__ import annotations

import enum
from typing import cast

from protocol import taproot_pb2 as pb


class ResultCode(enum.IntEnum):
    SUCCESS = pb.SUCCESS
    UNKNOWN = pb.UNKNOWN
    TIMEOUT = pb.TIMEOUT
    NOT_CONNECTED = pb.NOT_CONNECTED
    CANCELED = pb.CANCELED
    NOT_SUPPORTED = pb.NOT_SUPPORTED
    REFUSED = pb.REFUSED
    INVALID_ARGUMENT = pb.INVALID_ARGUMENT
    NOT_READY = pb.NOT_READY
    NO_ROUTE = pb.NO_ROUTE
    UNAUTHENTICATED = pb.UNAUTHENTICATED
    NOT_AUTHORIZED = pb.NOT_AUTHORIZED
    LIMIT_MESSAGES = pb.LIMIT_MESSAGES
    LIMIT_BYTES = pb.LIMIT_BYTES
    STORAGE_FAILURE = pb.STORAGE_FAILURE

    @classmethod
    def of(cls, code: int) -> "ResultCode":
        """The code a peer sent, as a `ResultCode`; a value this version does
        not know (a newer peer) reads as UNKNOWN instead of raising."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


def wire(code: ResultCode | int) -> "pb.ResultCode":
    """A code as the generated protobuf type (an int at runtime)."""
    return cast("pb.ResultCode", int(code))


def status(code: ResultCode | int, message: str = "") -> pb.Status:
    return pb.Status(code=wire(code), message=message)


# Payload compression: the wire code of each algorithm and its name in the
# tables' `compression` column (null there means none).
COMPRESSION_CODES: dict[str, int] = {"zlib": pb.COMPRESSION_ZLIB, "zstd": pb.COMPRESSION_ZSTD}
COMPRESSION_NAMES: dict[int, str] = {code: name for name, code in COMPRESSION_CODES.items()}
