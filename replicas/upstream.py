"""The shell around a `Relay`: one upstream session at a time, a grpc.aio
stream on the process's event loop (`protocol.stream.event_loop`).

`Upstream` connects to the first reachable address of `hosts()` (asked again
before every attempt, so a node can point it at a partition's current
primary), feeds the relay the frames of both directions, and on loss keeps the
relay's routes and retransmission buffer, connects again (the same address or
the next) and lets the relay reopen its queues and resend. Downstream links
stay up through a failover: clients see at most a pause.

Used by the proxy (hosts: the cluster's nodes) and by a node for partitions
another node leads (hosts: that partition's primary). Thread safe: every relay
call happens under one lock, so upstream order is relay order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent import futures
from typing import Any, Callable

import grpc
import grpc.aio

from protocol import bundles, pb
from protocol.auth import metadata as auth_metadata
from protocol.clock import wall_time_us
from protocol.liveness import Due, Liveness, heartbeat
from protocol.metrics import FrameCounts
from protocol.retransmit import RetransmissionLimits
from protocol.stream import GRPC_OPTIONS, Link, event_loop, session_stream
from protocol.tls import ClientTls, connect_aio
from replicas.relay import UPSTREAM, Out, Relay

log = logging.getLogger(__name__)
EXPIRE_INTERVAL_S = 0.5
# A graceful stop's wait for the upstream to handle the last frames and end
# the stream (`Upstream.stop`); the frames are already on their way by then.
STOP_FLUSH_S = 2.0


class Upstream:
    def __init__(self, hosts: Callable[[], list[str]], *, name: str = "proxy",
                 limits: RetransmissionLimits | None = None, reconnect_interval_s: float = 0.2,
                 connect_timeout_s: float = 1.0, tls: ClientTls | None = None, token: str | None = None):
        self.hosts = hosts
        self.tls = tls                     # TLS to the nodes above (`protocol.tls`); None: plaintext
        # The cluster token with [auth] on (`protocol.auth`), and that this
        # relay reads several frames a message (`protocol.bundles`).
        self._metadata = auth_metadata(token) + bundles.BUNDLES_METADATA
        self.name = name
        self.reconnect_interval_s = reconnect_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.relay = Relay(limits, connected=False)
        self.address: str | None = None
        self.connects = 0                  # successful connections so far (the first and every failover)
        self.frames = FrameCounts()        # what passes to and from the links below (metrics)
        self._lock = threading.Lock()
        self._links: set[Link] = set()
        self._stopped_links: set[Link] = set()   # answered our StopRequest
        # What goes up (frames serialized as the relay queues them); a fresh
        # one each connection, written by the session on the event loop.
        self._up_out = Link("upstream")
        self._stop = threading.Event()
        self._ended = threading.Event()    # the session's task has finished
        self.connected = threading.Event()
        self._next_host = 0
        self._channel: grpc.aio.Channel | None = None   # the upstream connection now, if any
        self._call: Any = None                          # its Session stream
        self._liveness = Liveness()   # heartbeats up, and when to give the upstream up
        # The session runs on the process's event loop (`protocol.stream.event_loop`):
        # in a proxy, the one its clients' streams run on, so relaying a frame
        # from either side hands nothing to another thread.
        self._loop = event_loop()
        self._session: "futures.Future[None] | None" = None
        self._expirer = threading.Thread(target=self._expire_loop, name=f"{name}-expire", daemon=True)

    @property
    def session_count(self) -> int:
        """Links below (clients, relays) connected now."""
        with self._lock:
            return len(self._links)

    def buffered(self) -> tuple[int, int]:
        """PUTs held for resending until their ACK: (messages, payload bytes)."""
        with self._lock:
            return self.relay.unacked_count, self.relay.unacked_bytes

    def start(self, connect_timeout_s: float = 0.0) -> None:
        self._session = asyncio.run_coroutine_threadsafe(self._upstream_loop(), self._loop)
        self._expirer.start()
        if connect_timeout_s and not self.connected.wait(connect_timeout_s):
            log.warning("%s: no upstream reachable yet among %s; retrying in the background", self.name,
                        self.hosts())

    def stop(self, flush_s: float = 0.0) -> None:
        """Stop relaying. `flush_s` > 0 (a graceful stop): first end the
        upstream stream the orderly way, every frame queued for it written
        and then the request side closed, and wait up to `flush_s` for the
        upstream to end it, which it does once it has handled every frame.
        Cancelling at once instead drops what the upstream has not read yet:
        the last CONFIRMs of a drain, and the node then delivers those
        messages again."""
        self._stop.set()
        if self._session is not None:
            if flush_s > 0:
                self.end_stream()
                if not self._ended.wait(flush_s):
                    log.warning("%s: the upstream did not end the stream within %.1f s of the last frame; "
                                "cancelling it", self.name, flush_s)
            self._session.cancel()   # cancels the task on the loop: its cleanup closes the stream and channel
            self._ended.wait(5)
        self._expirer.join(5)

    def end_stream(self) -> None:
        """The first half of a graceful `stop`, which returns at once: nothing
        more goes up, and the upstream stream is closed after what is queued."""
        self._stop.set()
        with self._lock:
            up_out = self._up_out
        up_out.close()

    # -- downstream ---------------------------------------------------------
    def open_link(self, link: Link) -> None:
        link.observer = self.frames.observe
        with self._lock:
            self._links.add(link)

    def on_frame(self, link: Link, frame: pb.Frame) -> None:
        self.frames.received(frame)
        with self._lock:
            self._links.add(link)
            if frame.WhichOneof("body") == "stop_response":
                self._stopped_links.add(link)
            self._send(self.relay.from_downstream(link, frame, time.monotonic() * 1000))

    def pause_consumers(self) -> None:
        with self._lock:
            self._send(self.relay.pause_consumers())

    def drain(self, timeout_s: float) -> bool:
        """Graceful stop of this hop: ask every client below to stop sending
        PUTs (StopRequest; they keep them for their next host), push nothing
        new, then wait until every PUT sent up is ACKed and every message
        pushed down is confirmed, or `timeout_s`. True if fully drained."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            links = set(self._links)
            for link in links:
                link.send(pb.Frame(stop_request=pb.StopRequest(request_id=1, timeout_ms=int(timeout_s * 1000))))
            self._send(self.relay.pause_consumers())

        def done() -> bool:
            with self._lock:
                answered = all(link in self._stopped_links or link.closed for link in links)
                return answered and self.relay.drained

        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
        drained = done()
        if drained:
            log.info("%s: drained", self.name)
        else:
            log.warning("%s: stop timeout reached with %d PUTs unacknowledged and %d messages unconfirmed",
                        self.name, self.relay.unacked_count, self.relay.unconfirmed_count)
        # End the client streams now, so they move to their next host at once
        # (the server's own stop would otherwise wait out its grace period).
        for link in links:
            link.close()
        return drained

    def close_link(self, link: Link) -> None:
        with self._lock:
            self._links.discard(link)
            self._stopped_links.discard(link)
            self._send(self.relay.downstream_closed(link))

    def _send(self, out: Out) -> None:
        # Called with the lock held: upstream order must match relay order.
        for destination, frame in out:
            if frame is None:
                destination.close()   # a link below (the relay never closes its upstream so)
            elif destination == UPSTREAM:
                self._up_out.send(frame)
            else:
                destination.send(frame)

    # -- upstream -----------------------------------------------------------
    async def _connect(self) -> tuple[grpc.aio.Channel, str] | None:
        addresses = self.hosts()
        for i in range(len(addresses)):
            address = addresses[(self._next_host + i) % len(addresses)]
            channel = await connect_aio(address, self.tls, GRPC_OPTIONS, self.connect_timeout_s)
            if channel is None:
                continue
            self._next_host = (self._next_host + i) % len(addresses)
            return channel, address
        return None

    async def _upstream_loop(self) -> None:
        """Connect, forward, and on any failure start over: this task must
        never end while the relay accepts clients (a frame that makes the
        relay raise costs a reconnection, which resends what is unacknowledged)."""
        try:
            while not self._stop.is_set():
                try:
                    await self._upstream_round()
                except Exception:
                    log.exception("%s: the upstream loop failed; reconnecting", self.name)
                    self.connected.clear()
                    await asyncio.sleep(self.reconnect_interval_s)
        finally:
            self._ended.set()

    async def _upstream_round(self) -> None:
        connected = await self._connect()
        if connected is None:
            await asyncio.sleep(self.reconnect_interval_s)
            return
        channel, address = connected
        if self._stop.is_set():   # stopped while connecting: nothing is to go up any more
            await channel.close()
            return
        up_out = Link(address)   # what goes up, serialized as it is queued, written by this loop
        with self._lock:
            self._up_out = up_out
            self.address = address
            self._channel = channel
            self._liveness.connected(time.monotonic() * 1000)
            self._send(self.relay.upstream_restored())
        call = session_stream(channel)(up_out.aio_frames(), metadata=self._metadata)
        self._call = call
        self.connects += 1
        log.info("%s: connected upstream to %s (%d queues to reopen, %d PUTs buffered)", self.name, address,
                 self.relay.route_count, self.relay.unacked_count)
        self.connected.set()
        reason = "upstream stream ended"
        try:
            # What goes up is bundled once the node says it reads bundles.
            up_out.bundles = bundles.offered(await call.initial_metadata())
            async for message in call:
                with self._lock:
                    self._liveness.heard(time.monotonic() * 1000)
                    for frame in bundles.STREAMS.read(message):
                        self._send(self.relay.from_upstream(frame, time.monotonic() * 1000))
        except grpc.RpcError as exc:
            reason = f"upstream lost: {exc.code().name}"
        except asyncio.CancelledError:
            if self._stop.is_set():
                raise   # stopping: the cleanup below still runs
            reason = "upstream left"   # the call cancelled here: a silent upstream (`_expire_loop`)
        except Exception as exc:
            log.exception("%s: relaying an upstream frame failed", self.name)
            reason = f"relaying an upstream frame failed ({type(exc).__name__}: {exc})"
        finally:
            self.connected.clear()
            with self._lock:
                self._send(self.relay.upstream_lost())
                self.address = None
                self._channel = None
                self._call = None
            up_out.close()
            call.cancel()
            await channel.close()
        # Start the next round with the next host: the one just lost is
        # probably the one that went away.
        self._next_host += 1
        if not self._stop.is_set():
            log.warning("%s: %s from %s; %d PUTs buffered, reconnecting", self.name, reason, address,
                        self.relay.unacked_count)
            await asyncio.sleep(self.reconnect_interval_s)

    def _expire_loop(self) -> None:
        """Expire buffered PUTs, heartbeat the upstream, and leave it if it
        has sent nothing at all for PEER_SILENCE_MAX_MS (frozen, or a link
        that stopped forwarding): its stream ends and the loop moves on."""
        while not self._stop.wait(EXPIRE_INTERVAL_S):
            try:
                silent = None
                with self._lock:
                    self._send(self.relay.expire(time.monotonic() * 1000))
                    due = self._liveness.due(time.monotonic() * 1000) if self._channel is not None else Due.NOTHING
                    if due is Due.HEARTBEAT:
                        self._up_out.send(heartbeat(wall_time_us()))
                    elif due is Due.LEAVE:
                        log.warning("%s: upstream %s silent for over %.1f s; moving to the next host", self.name,
                                    self.address, self._liveness.silence_max_ms / 1000)
                        silent = self._call
                if silent is not None:
                    self._loop.call_soon_threadsafe(silent.cancel)
            except Exception:
                log.exception("%s: expiring buffered PUTs failed; trying again", self.name)
