"""TLS on every gRPC link (`[tls]` in cluster.toml, `docs/operations.md`):
clients (the SDK, proxies, nodes relaying, the pipeline's notices, `taproot
admin`) verify the server against the cluster's CA; with `client_certs`
servers ask each client for a certificate signed by that CA too (mutual
TLS). One certificate serves every role of a cluster (its names cover every
node and proxy host).

This module only reads PEM files and makes gRPC credentials: the SDK needs
nothing more. `taproot_ops.tls_init` makes a throwaway CA (`make run`)."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import grpc
import grpc.aio

ENV_CA, ENV_CERT, ENV_KEY = "TAPROOT_TLS_CA_FILE", "TAPROOT_TLS_CERT_FILE", "TAPROOT_TLS_KEY_FILE"


class TlsError(ValueError):
    """A certificate or key file that cannot be used; the message names it."""


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{what} {path}: cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsError(f"{what} {path}: not a PEM file")
    return data


@dataclass(frozen=True)
class ClientTls:
    """What a client needs: the CA that signed the servers' certificate and,
    for mutual TLS, its own certificate and key (PEM bytes)."""
    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca_file: str, cert_file: str | None = None, key_file: str | None = None) -> "ClientTls":
        if bool(cert_file) != bool(key_file):
            raise TlsError("a client certificate needs its key, and a key its certificate")
        return cls(_read(ca_file, "CA certificate"),
                   _read(cert_file, "certificate") if cert_file else None,
                   _read(key_file, "private key") if key_file else None)

    @classmethod
    def from_env(cls) -> "ClientTls | None":
        """From TAPROOT_TLS_CA_FILE (and TAPROOT_TLS_CERT_FILE, TAPROOT_TLS_KEY_FILE
        for mutual TLS), None when it is not set: how a `Session` made without
        `tls` finds a cluster's CA (`taproot_ops` tools, a deployment's env)."""
        ca = os.environ.get(ENV_CA)
        if not ca:
            return None
        return cls.from_files(ca, os.environ.get(ENV_CERT) or None, os.environ.get(ENV_KEY) or None)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


@dataclass(frozen=True)
class ServerTls:
    ca: bytes
    cert: bytes
    key: bytes
    client_certs: bool = False

    @classmethod
    def from_files(cls, ca_file: str, cert_file: str, key_file: str, client_certs: bool = False) -> "ServerTls":
        return cls(_read(ca_file, "CA certificate"), _read(cert_file, "certificate"), _read(key_file, "private key"),
                   client_certs)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.client_certs)

    def client(self) -> ClientTls:
        """What this role presents when it is the client (a proxy to its node,
        a node relaying to another): the same CA, and with mutual TLS the
        same certificate."""
        return ClientTls(self.ca, self.cert, self.key)


def channel(address: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to `address`: TLS with `tls`, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, tls.credentials(), options=list(options))


def aio_channel(address: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
    """`channel` for grpc.aio, on the running event loop."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, tls.credentials(), options=list(options))


# How long a host may take to answer a TCP connect before it counts as
# unreachable: the kernel answers, whatever load its processes are under, so
# this is about the network only (a lost SYN costs one more attempt).
PROBE_TIMEOUT_S = 0.5


def connect(address: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]], timeout_s: float
            ) -> grpc.Channel | None:
    """A connected channel to `address`, or None after `timeout_s`. A host
    that refuses the connection (nothing listens there: a process that died
    on a machine that is up) is given up at once, and one that does not
    answer within PROBE_TIMEOUT_S (a machine gone, a link cut) then: who
    dials a list of hosts moves on to the next (a node's failover waited out
    a second here for a primary that was gone, and two for one cut off). A
    plain TCP connect tells, because gRPC's own state does not: its channel
    reports a refusal as TRANSIENT_FAILURE and keeps retrying, and closing a
    channel just watched for that blocks in grpcio."""
    if not _answers(address, min(timeout_s, PROBE_TIMEOUT_S)):
        return None
    conn = channel(address, tls, options)
    ready = grpc.channel_ready_future(conn)
    try:
        ready.result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        ready.cancel()   # its watch of the channel first: a watch left on a closed channel raises in gRPC's thread
        conn.close()
        return None
    return conn


async def connect_aio(address: str, tls: ClientTls | None, options: Sequence[tuple[str, Any]], timeout_s: float
                      ) -> grpc.aio.Channel | None:
    """`connect` on the running event loop: a grpc.aio channel to `address`,
    ready, or None after `timeout_s` (the TCP probe runs off the loop)."""
    if not await asyncio.to_thread(_answers, address, min(timeout_s, PROBE_TIMEOUT_S)):
        return None
    conn = aio_channel(address, tls, options)
    try:
        await asyncio.wait_for(conn.channel_ready(), timeout_s)
    except asyncio.TimeoutError:
        await conn.close()
        return None
    return conn


def _answers(address: str, timeout_s: float) -> bool:
    """False if `address` (host:port) refused a TCP connect, or did not
    answer within `timeout_s`; True if it accepted, or is not a host:port
    this can dial (gRPC decides then)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (ConnectionRefusedError, TimeoutError):
        return False
    except (OSError, ValueError):
        return True


def add_port(server: Any, address: str, tls: ServerTls | None) -> int:
    """Bind `address` on a gRPC server (sync or aio), with TLS if given; the port bound (0: failed)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, tls.credentials()))
