"""The admin API's plumbing, shared by nodes and proxies: one gRPC call,
`Admin.Command`, naming a command; the reply is JSON (as BlazingMQ's admin
commands answer) or a refusal with a stable `ResultCode` and why. Each role
registers its commands (`primary.admin`, `proxies.server`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from typing import Any, Callable, Mapping

import grpc

from protocol import pb
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.auth import Authenticator, Denied, admin_scope, presented
from protocol.codes import ResultCode, wire

log = logging.getLogger(__name__)

COMMANDS = ("status", "domains", "queues", "queue", "purge", "stop")


class AdminError(Exception):
    """A refused admin command: a stable code and why."""

    def __init__(self, code: ResultCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


Handler = Callable[[pb.AdminRequest], Mapping[str, Any]]


def stop_after_answer(delay_s: float = 0.2) -> None:
    """`stop`: the role's graceful stop (its SIGTERM handler: drain, then go),
    begun once the command's answer is on its way."""
    threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGTERM)).start()


def answer(handlers: Mapping[str, Handler], role: str, request: pb.AdminRequest) -> pb.AdminReply:
    """Run one command: its JSON, or a refusal (never an exception)."""
    handler = handlers.get(request.command)
    if handler is None:
        known = ", ".join(c for c in COMMANDS if c in handlers)
        return pb.AdminReply(code=wire(ResultCode.INVALID_ARGUMENT),
                             message=f"{role}: unknown command {request.command!r} (a {role} answers: {known})")
    try:
        return pb.AdminReply(code=wire(ResultCode.SUCCESS), json=json.dumps(handler(request), default=str))
    except AdminError as exc:
        return pb.AdminReply(code=wire(exc.code), message=exc.message)
    except Exception as exc:   # a bug: say so, keep serving
        log.exception("%s: admin command %s failed", role, request.command)
        return pb.AdminReply(code=wire(ResultCode.UNKNOWN), message=f"{role}: {request.command} failed: {exc}")


class AdminServicer(pb_grpc.AdminServicer):
    """Commands run on a worker thread: a purge waits for its commit, the
    rates for their window. With `auth` each command needs the admin right
    on its domain, or cluster-wide (`protocol.auth.admin_scope`)."""

    def __init__(self, role: str, handlers: Mapping[str, Handler], auth: Authenticator | None = None):
        self.role = role
        self.handlers = handlers
        self.auth = auth

    async def Command(self, request: pb.AdminRequest,  # noqa: N802 (gRPC naming)
                      context: grpc.aio.ServicerContext) -> pb.AdminReply:
        if self.auth is not None:
            verdict = self.auth.check(presented(context.invocation_metadata()), ("admin",), admin_scope(request))
            if isinstance(verdict, Denied):
                return pb.AdminReply(code=wire(verdict.code), message=f"{self.role}: {verdict.message}")
        return await asyncio.get_running_loop().run_in_executor(None, answer, self.handlers, self.role, request)
