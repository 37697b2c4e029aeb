"""A node's admin API (`taproot admin`, the status page): what the running
node knows, as JSON-ready dicts, and the two commands that change something
(purge, stop). The gRPC service (`protocol.admin`) wraps these; a refusal
is an `AdminError` with a stable code.

Each node answers for itself: the partitions it leads (their queues, their
pipeline lag) and what it sees of the others' leases. `taproot admin`
asks every node of the cluster and puts the answers together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from primary.metrics import authority_lag_s
from protocol.admin import AdminError, stop_after_answer
from protocol.codes import ResultCode
from protocol.uri import parse_queue_uri, partition_of

if TYPE_CHECKING:
    from primary.node import Node
    from primary.partition import Partition, QueueState

RATE_WINDOW_S = 1.0       # a rate is measured over at least this long
RATE_STALE_S = 30.0       # a previous sample older than this is not used


def _consumer_peer(key: object) -> tuple[str, int]:
    link, queue_id = key if isinstance(key, tuple) else (key, 0)
    return str(getattr(link, "peer", link)), int(queue_id)


class NodeAdmin:
    def __init__(self, node: "Node"):
        self.node = node
        self.started = time.time()
        self._samples_lock = threading.Lock()
        self._sample: tuple[float, dict[tuple[str, str], tuple[int, int, int]]] | None = None

    # -- status -----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        node = self.node
        leadership = node.leadership
        partitions = []
        now = time.time()
        for p in range(node.config.partitions):
            view = leadership.view(p)
            led = node.partitions.get(p)
            entry: dict[str, Any] = {
                "partition": p,
                "leader": view.holder if view is not None and view.epoch and not view.released else "",
                "leader_address": view.address if view is not None and not view.released else "",
                "epoch": view.epoch if view is not None else 0,
                "here": led is not None,
            }
            if led is not None:
                entry["authority_lag_s"] = round(authority_lag_s(led, now), 3)
                entry["queues"] = len(led.queues)
            partitions.append(entry)
        messages, nbytes = node.forwarding.buffered()
        return {"role": "node", "name": node.name, "address": node.address, "cluster": node.config.name,
                "pid": os.getpid(), "started": self.started, "uptime_s": round(now - self.started, 1),
                "partitions": partitions, "domains_version": domains_version(node.config.domains),
                "retransmission_buffer": {"messages": messages, "bytes": nbytes}}

    def domains(self) -> dict[str, Any]:
        domains = self.node.config.domains
        return {"name": self.node.name, "version": domains_version(domains),
                "domains": {name: domain_dict(d) for name, d in sorted(domains.items())}}

    # -- queues ------------------------------------------------------------------
    def queues(self, domain: str = "", rates: bool = True) -> dict[str, Any]:
        """Every queue of the partitions led here (of `domain`), with its
        counts and, with `rates`, its rates a second (the status page works
        its own out from successive answers)."""
        if domain and domain not in self.node.config.domains:
            raise AdminError(ResultCode.INVALID_ARGUMENT, f"no domain {domain!r} on node {self.node.name}")
        rows = self._with_rates(self._queue_rows()) if rates else self._queue_rows()
        return {"name": self.node.name, "queues": [r for r in rows if not domain or r["domain"] == domain]}

    def queue(self, uri_text: str) -> dict[str, Any]:
        partition, state = self._find(uri_text)
        now_us = time.time() * 1e6
        apps = []
        with partition.lock:
            for app, d in sorted(state.dispatchers.items()):
                consumers = []
                for info in d.consumers_info():
                    peer, queue_id = _consumer_peer(info.pop("key"))
                    consumers.append({"peer": peer, "queue_id": queue_id, **info})
                oldest = d.oldest_pending()
                apps.append({
                    "app": app, "waiting": d.pending_count, "unconfirmed": d.unconfirmed_count,
                    "consumers": consumers,
                    "oldest_waiting": None if oldest is None else {
                        "seq": oldest.seq, "guid": oldest.guid.hex(),
                        "age_s": round((now_us - oldest.put_time_us) / 1e6, 3) if oldest.put_time_us else None,
                        "delivery_count": oldest.delivery_count}})
        return {"name": self.node.name, "uri": state.uri.canonical, "partition": partition.index,
                "mode": state.domain.mode, "consumers": state.consumers, "producers": state.producers,
                "apps": apps}

    # -- commands ------------------------------------------------------------------
    def purge(self, uri_text: str, app: str = "") -> dict[str, Any]:
        from primary.partition import PurgeFailed

        partition, state = self._find(uri_text)
        apps = state.domain.apps if state.domain.mode == "fanout" else ()
        if app and app not in apps:
            raise AdminError(ResultCode.INVALID_ARGUMENT,
                             f"{state.uri.canonical} has no app {app!r}" + (f" (apps: {', '.join(apps)})" if apps
                                                                           else " (not a fanout queue)"))
        try:
            purged = partition.purge(state, app or None)
        except PurgeFailed as exc:
            raise AdminError(ResultCode.STORAGE_FAILURE, str(exc)) from None
        return {"name": self.node.name, "uri": state.uri.canonical, "purged": purged,
                "total": sum(purged.values())}

    def stop(self) -> dict[str, Any]:
        """The graceful stop of `taproot node stop` (drain, hand the
        partitions over), begun after this answer is sent."""
        stop_after_answer()
        return {"name": self.node.name, "stopping": True}

    def page_data(self) -> dict[str, Any]:
        """What the status page shows (`/status.json`)."""
        return {"time": time.time(), "status": self.status(), "queues": self.queues(rates=False)["queues"]}

    def handlers(self) -> dict[str, Any]:
        """The admin commands a node answers (`protocol.admin`)."""
        return {"status": lambda r: self.status(), "domains": lambda r: self.domains(),
                "queues": lambda r: self.queues(r.domain), "queue": lambda r: self.queue(r.uri),
                "purge": lambda r: self.purge(r.uri, r.app), "stop": lambda r: self.stop()}

    # -- helpers -------------------------------------------------------------------
    def _queue_rows(self) -> list[dict[str, Any]]:
        """Every queue led here with its counts, each partition's read under
        its lock (a dispatcher's state changes under it)."""
        rows = []
        for p, partition in sorted(self.node.partitions.items()):
            with partition.lock:
                for state in partition.queues.values():
                    apps = []
                    for app, d in sorted(state.dispatchers.items()):
                        held = d.unconfirmed_count
                        apps.append({"app": app, "depth": d.pending_count + held, "unconfirmed": held,
                                     "pushed": d.pushed, "confirmed": d.confirmed, "redelivered": d.redelivered,
                                     "dead_lettered": sum(d.dropped.values()), "purged": d.purged})
                    rows.append({"uri": state.uri.canonical, "domain": state.uri.domain, "queue": state.uri.queue,
                                 "partition": p, "mode": state.domain.mode, "consumers": state.consumers,
                                 "producers": state.producers, "puts": state.accepted, "apps": apps})
        return sorted(rows, key=lambda r: (r["domain"], r["queue"]))

    def _find(self, uri_text: str) -> tuple["Partition", "QueueState"]:
        uri = parse_queue_uri(uri_text)
        if isinstance(uri, str):
            raise AdminError(ResultCode.INVALID_ARGUMENT, uri)
        p = partition_of(uri, self.node.config.partitions)
        partition = self.node.partitions.get(p)
        if partition is None:
            view = self.node.leadership.view(p)
            where = f"node {view.holder} ({view.address})" if view is not None and view.epoch else "no node yet"
            raise AdminError(ResultCode.NOT_READY, f"partition {p} of {uri.canonical} is led by {where}, "
                                                   f"not {self.node.name}")
        state = partition.queues.get((uri.domain, uri.queue))
        if state is None:
            raise AdminError(ResultCode.INVALID_ARGUMENT, f"{uri.canonical}: no such queue on partition {p} "
                                                          "(never opened since this node took the partition)")
        return partition, state

    def _with_rates(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`rows` with puts, pushes and confirms a second since the previous
        call's sample; without a recent one, over the next RATE_WINDOW_S (the
        call waits, and answers with the rows read then)."""
        with self._samples_lock:
            now = time.monotonic()
            previous = self._sample
            if previous is None or now - previous[0] > RATE_STALE_S:
                time.sleep(RATE_WINDOW_S)
                previous = (now, _counts(rows))
                now, rows = time.monotonic(), self._queue_rows()
            counts = _counts(rows)
            if now - previous[0] >= RATE_WINDOW_S:
                self._sample = (now, counts)
        start, before = previous
        elapsed = max(now - start, 1e-9)

        def rate(key: tuple[str, str], field: int) -> float:
            return round(max(0, counts[key][field] - before.get(key, (0, 0, 0))[field]) / elapsed, 1)

        for row in rows:
            row["puts_per_s"] = rate((row["uri"], "*"), 0)
            for app in row["apps"]:
                app["pushes_per_s"] = rate((row["uri"], app["app"]), 1)
                app["confirms_per_s"] = rate((row["uri"], app["app"]), 2)
        return rows


def _counts(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(puts, pushes, confirms) of every queue (app "*") and app of `rows`."""
    counts: dict[tuple[str, str], tuple[int, int, int]] = {}
    for row in rows:
        counts[(row["uri"], "*")] = (row["puts"], 0, 0)
        for app in row["apps"]:
            counts[(row["uri"], app["app"])] = (0, app["pushed"], app["confirmed"])
    return counts


def domain_dict(domain: Any) -> dict[str, Any]:
    raw = dataclasses.asdict(domain)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in raw.items()}


def domains_version(domains: Any) -> str:
    """A short digest of the domain definitions: equal on every node that
    runs the same configuration."""
    text = json.dumps({n: domain_dict(d) for n, d in sorted(domains.items())}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
