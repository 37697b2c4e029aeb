"""Taproot's wire protocol: the `.proto`, its generated code, and the small
pieces every role shares: result codes (`codes`), queue URIs and their
partition (`uri`), property encoding (`properties`), the subscription language
(`expression`), columnar frames (`columns`), frames built without the
protobuf runtime's merge (`frames`), constants and defaults defined once
(`limits`), seq ranges for CONFIRMs and PUSH headers (`seqs`), the
retransmission buffer the SDK and every hop keep (`retransmit`), the
injectable clock (`clock`), the gRPC stream plumbing (`stream`) and a `/proc`
reader (`procstat`).

Generated code (`taproot_pb2*.py`) is checked in so that installing Taproot needs
no protoc; `make proto` regenerates it after an edit to `taproot.proto`.
It ships with the SDK, so it needs nothing a client does not install.

Imports: (nothing else from Taproot).
Never: pyspark, delta, deltalake, pandas.
Pure: codes, columns, expression, frames, limits, liveness, properties, retransmit, seqs, taproot_pb2, uri.
"""

from typing import Any

from protocol import taproot_pb2 as pb
from protocol.codes import ResultCode, status, wire
from protocol.uri import QueueUri, parse_queue_uri

__all__ = ["pb", "pb_grpc", "ResultCode", "status", "wire", "QueueUri", "parse_queue_uri"]


def __getattr__(name: str) -> Any:
    # The gRPC stubs load grpc: only the shells that open streams ask for them,
    # so the pure cores that speak `pb` frames never load it.
    if name == "pb_grpc":
        from protocol import taproot_pb2_grpc
        return taproot_pb2_grpc
    raise AttributeError(f"module 'protocol' has no attribute {name!r}")
