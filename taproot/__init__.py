"""Taproot's Python SDK: producers and consumers with BlazingMQ's semantics.

PUT -> ACK (durable in Delta), PUSH -> CONFIRM, 16-byte GUIDs made here,
at-least-once delivery. See `taproot.session` for the API.
"""

from taproot.batching import BatchPolicy
from taproot.errors import (AckError, ConnectionError, InvalidArgumentError, PostError, RefusedError,
                            RequestError, TaprootError, TimeoutError)
from taproot.session import Ack, Message, Queue, Session
from protocol import ResultCode

__all__ = [
    "Session", "Queue", "Message", "Ack", "BatchPolicy", "ResultCode",
    "TaprootError", "ConnectionError", "RequestError", "InvalidArgumentError", "RefusedError",
    "TimeoutError", "PostError", "AckError",
]
