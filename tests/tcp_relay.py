"""A TCP relay a test controls: it forwards bytes between its port and a
target until `stall()`, then forwards nothing either way (connections stay
open, bytes stay in the kernel's buffers, new connections are accepted and
left silent) until `resume()`. A link that stops forwarding, as a hung
middlebox or a half-dead route would."""

from __future__ import annotations

import selectors
import socket
import threading


class StallableRelay:
    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def stall(self) -> None:
        self._forwarding.clear()

    def resume(self) -> None:
        self._forwarding.set()

    def close(self) -> None:
        self._closed.set()
        self._forwarding.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), name="relay-pump", daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for s in (a, b):
                selector.register(s, selectors.EVENT_READ)
            while not self._closed.is_set():
                if not self._forwarding.wait(0.1):
                    continue
                for key, _ in selector.select(0.1):
                    if not self._forwarding.is_set():
                        break
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                        if not data:
                            raise OSError("closed")
                        peer[source].sendall(data)
                    except OSError:
                        for s in (a, b):
                            s.close()
                        return
