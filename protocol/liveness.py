"""When a link's client heartbeats its host, and when it gives the host up.

The SDK and every upstream (a proxy's, a node's forwarding) send a Heartbeat
every HEARTBEAT_INTERVAL_MS; the host echoes it. A client that has heard
nothing at all for PEER_SILENCE_MAX_MS leaves the host for its next one (see
`protocol/limits.py` for why gRPC's pings are not enough). Pure: time comes
in as an argument, in milliseconds on the caller's monotonic clock.
"""

from __future__ import annotations

import enum

from protocol import taproot_pb2 as pb
from protocol.limits import HEARTBEAT_INTERVAL_MS, PEER_SILENCE_MAX_MS


class Due(enum.Enum):
    NOTHING = "nothing"
    HEARTBEAT = "heartbeat"   # send one up now
    LEAVE = "leave"           # the host has been silent too long: give it up


class Liveness:
    def __init__(self, interval_ms: float = HEARTBEAT_INTERVAL_MS, silence_max_ms: float = PEER_SILENCE_MAX_MS):
        self.interval_ms = interval_ms
        self.silence_max_ms = silence_max_ms
        self.heard_ms = 0.0   # when the host last sent a frame
        self.beat_ms = 0.0    # when the last heartbeat went up

    def connected(self, now_ms: float) -> None:
        self.heard_ms = self.beat_ms = now_ms

    def heard(self, now_ms: float) -> None:
        self.heard_ms = now_ms

    def due(self, now_ms: float) -> Due:
        """What the client owes the link now. LEAVE once per silence."""
        if now_ms - self.heard_ms > self.silence_max_ms:
            self.heard_ms = now_ms
            return Due.LEAVE
        if now_ms - self.beat_ms >= self.interval_ms:
            self.beat_ms = now_ms
            return Due.HEARTBEAT
        return Due.NOTHING


def heartbeat(sent_time_us: int) -> pb.Frame:
    return pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=sent_time_us))
