"""The SDK's exceptions: one root, and gRPC failures mapped once, here.

    TaprootError
    ├── ConnectionError          no host reachable, or the session's link dropped
    ├── RequestError             the broker answered a request with a failure status
    │   ├── InvalidArgumentError     INVALID_ARGUMENT (bad URI, bad option, ...)
    │   ├── RefusedError             REFUSED (unknown domain, wrong access, ...)
    │   ├── UnauthenticatedError     UNAUTHENTICATED ([auth]: no token, a wrong, revoked or expired one)
    │   ├── NotAuthorizedError       NOT_AUTHORIZED (the token lacks the right; the message names it)
    │   └── TimeoutError             no answer within the deadline
    ├── PostError                a PUT was not accepted (raised locally before sending)
    └── AckError                 a PUT's ACK carried a failure code (see .code)
"""

from __future__ import annotations

from protocol import ResultCode


class TaprootError(Exception):
    """Root of every error the SDK raises."""


class ConnectionError(TaprootError):  # noqa: A001 - deliberately scoped to the SDK
    pass


class RequestError(TaprootError):
    def __init__(self, code: ResultCode, message: str):
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message


class InvalidArgumentError(RequestError):
    pass


class RefusedError(RequestError):
    pass


class UnauthenticatedError(RequestError):
    pass


class NotAuthorizedError(RequestError):
    pass


class TimeoutError(RequestError):  # noqa: A001
    pass


class PostError(TaprootError):
    pass


class AckError(TaprootError):
    def __init__(self, code: ResultCode, message: str, guid: bytes):
        super().__init__(f"PUT {guid.hex().upper()} failed: {code.name}" + (f": {message}" if message else ""))
        self.code = code
        self.message = message
        self.guid = guid


def request_error(code: int, message: str) -> RequestError:
    result = ResultCode.of(code)
    cls = {ResultCode.INVALID_ARGUMENT: InvalidArgumentError, ResultCode.REFUSED: RefusedError,
           ResultCode.TIMEOUT: TimeoutError, ResultCode.UNAUTHENTICATED: UnauthenticatedError,
           ResultCode.NOT_AUTHORIZED: NotAuthorizedError}.get(result, RequestError)
    return cls(result, message)
