"""Taproot's wire protocol: the `.proto`, its generated code, and the small
pieces every role shares (result codes, queue URIs, property encoding).

Generated code (`taproot_pb2*.py`) is checked in so that installing Taproot needs
no protoc; `make proto` regenerates it after an edit to `taproot.proto`.
This package imports nothing else from Taproot.
"""

from protocol import taproot_pb2 as pb
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.codes import ResultCode, status, wire
from protocol.uri import QueueUri, parse_queue_uri

__all__ = ["pb", "pb_grpc", "ResultCode", "status", "wire", "QueueUri", "parse_queue_uri"]
