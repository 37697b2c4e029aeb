"""Taproot's Python SDK: producers and consumers with BlazingMQ's semantics.

PUT -> ACK (durable in Delta), PUSH -> CONFIRM, 16-byte GUIDs made here,
at-least-once delivery. See `taproot.session` for the API.

`session.py` is the public API and its thread and gRPC shell; `core.py` is
the session's logic, sans I/O (connection state, retransmission buffer,
batches, requests); `mirror.py` posts each PUT over two or more paths
(`MirroredSession`, RAIS's mirroring). `import taproot` loads neither gRPC nor the session
until a name from it is used.

Imports: protocol.
Never: pyspark, delta, deltalake, pandas.
Pure: batching, core, errors, events.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from protocol import ResultCode
from taproot.batching import BatchPolicy
from taproot.errors import (
    AckError,
    ConnectionError,
    InvalidArgumentError,
    NotAuthorizedError,
    PostError,
    RefusedError,
    RequestError,
    TaprootError,
    TimeoutError,
    UnauthenticatedError,
)

if TYPE_CHECKING:
    from protocol.tls import ClientTls
    from taproot.mirror import MirroredQueue, MirroredSession
    from taproot.session import Ack, Message, Queue, Session

__all__ = [
    "Session", "Queue", "Message", "Ack", "MirroredSession", "MirroredQueue", "BatchPolicy", "ResultCode",
    "TaprootError", "ConnectionError", "RequestError", "InvalidArgumentError", "RefusedError",
    "TimeoutError", "UnauthenticatedError", "NotAuthorizedError", "PostError", "AckError", "ClientTls",
]
_LAZY = {"Session": "taproot.session", "Queue": "taproot.session", "Message": "taproot.session",
         "Ack": "taproot.session", "MirroredSession": "taproot.mirror", "MirroredQueue": "taproot.mirror",
         "ClientTls": "protocol.tls"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'taproot' has no attribute {name!r}")
