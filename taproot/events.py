"""Session events: what happened to a session's connection.

    def on_event(event):
        if isinstance(event, ConnectionLost):
            log.warning("lost %s: %s", event.host, event.reason)

    Session(hosts=[...], on_event=on_event)

Order for one failover: `ConnectionLost` -> `Reconnected` (a host answered and
the queues and unacknowledged PUTs were sent again) -> `StateRestored` (every
queue is open again). The application need not do anything: PUTs posted in
between wait in the retransmission buffer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionEvent:
    host: str


@dataclass(frozen=True)
class Connected(SessionEvent):
    """The session's first connection is up."""


@dataclass(frozen=True)
class ConnectionLost(SessionEvent):
    reason: str
    unacknowledged: int           # PUTs waiting in the retransmission buffer


@dataclass(frozen=True)
class Reconnected(SessionEvent):
    retransmitted: int            # PUTs sent again


@dataclass(frozen=True)
class StateRestored(SessionEvent):
    reopened: int                 # queues open again
    failed: tuple[str, ...] = ()  # queue URIs the cluster would not reopen (their queues are closed)


@dataclass(frozen=True)
class StopRequested(SessionEvent):
    """The host is stopping gracefully: new PUTs wait in the buffer until the
    session reaches the next host."""
