"""Federation links, the sending side (docs/federation.md).

A push link carries some domains of this cluster to another Taproot cluster
(OpenAMQ's Message Transfer Agent, `../shared/seeds/000_*` 3.5). It runs in
the primary of each partition, beside the PUT log it reads: one
`LinkForwarder` per (link, partition), started and stopped with the
partition, so it moves with the partition's lease.

Each round it reads the PUT-log rows committed since its last round (woken by
every PUT commit), keeps the ones the link carries, and posts them to the
remote cluster through the SDK (`post_columns`, one frame per queue, each
message with its own GUID), then records how far it got: the PUT log's
version and seq, in a small file beside the partition's tables, written only
after the remote cluster ACKed every row of the round (durable there). After
a restart, a failover or a broken link it resumes from that record, so
nothing ACKed here is lost on the way, and the rows of an unfinished round
are posted again: the remote cluster's dedup window (the GUID history)
drops the second copy, so each message is delivered there once.

Which rows: those of the link's domains whose queue is `name@<link cluster>`
(global routing: posted to `name` there, whatever `forward` is), and, with
`forward = "all"`, every other local message, or with `"unmatched"` those no
local app subscription takes (the domain's `[subscriptions]`; consumer
subscriptions come and go and are not looked at). Never a row whose
`taproot.via` property (the clusters it has passed, comma-separated, set by
each link) names the remote cluster: two links pushing a domain both ways, or
round a ring, do not send a message back where it has been.

The remote side needs nothing configured but the domains: to it a link is a
producer like any other.
"""

from __future__ import annotations

import json
import logging
import os
import queue as queue_module
import re
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from conf import DomainConfig, LinkConfig
from primary.express import AppRules
from protocol.properties import VIA, from_wire, maps_to_wire
from protocol.tls import ClientTls
from storage import deltars, tables
from taproot import errors
from taproot.session import Queue, Session

log = logging.getLogger(__name__)

READ_COLUMNS = ["domain", "queue", "guid", "seq", "payload", "properties", "property_types", "compression"]
VERSIONS_PER_READ = 20          # PUT-log commits read per round at most (a resume reads in steps)
ACK_TIMEOUT_S = 120.0
IDLE_POLL_S = 1.0               # a round even without a commit's notice (another writer, a lost notice)


class Progress:
    """How far a link got in a partition's PUT log: every row up to `seq`,
    read up to PUT-log `version`, is durable on the remote cluster. A JSON
    file beside the partition's tables, replaced atomically: on a local
    disk write, fsync, rename, fsync the directory; on an object store one
    PUT (which replaces an object whole)."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> tuple[int, int] | None:
        """(version, seq); None before the link's first round ever; (-1, -1),
        the log's start, when the file is unreadable."""
        try:
            saved = json.loads(self._read())
            return int(saved["version"]), int(saved["seq"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Unreadable: start over. Every row is posted again; the remote's
            # dedup window drops what it has (the rows older than its window
            # come twice: said loudly).
            log.error("link progress %s unreadable (%s): forwarding this partition's PUT log from its start",
                      self.path, exc)
            return -1, -1

    def _read(self) -> bytes:
        local = deltars.local_root(self.path)
        if local is not None:
            with open(local, "rb") as fh:
                return fh.read()
        store, path = deltars.file_system(self.path)
        with store.open_input_stream(path) as stream:
            return bytes(stream.read())

    def save(self, version: int, seq: int) -> None:
        data = json.dumps({"version": version, "seq": seq, "saved_at": time.time()}).encode()
        local = deltars.local_root(self.path)
        if local is None:
            store, path = deltars.file_system(self.path)
            with store.open_output_stream(path) as stream:
                stream.write(data)
            return
        directory = os.path.dirname(local)
        os.makedirs(directory, exist_ok=True)
        temporary = f"{local}.tmp"
        with open(temporary, "wb") as fh:
            fh.write(data)
            fh.flush()
            deltars.fsync(fh.fileno())
        os.replace(temporary, local)
        deltars.fsync_path(directory)


def progress_path(data_dir: str, partition: int, link: str) -> str:
    return os.path.join(tables.PartitionPaths(data_dir, partition).root, "links", f"{link}.json")


class LinkForwarder:
    """One push link's forwarding for one partition (see the module's docstring)."""

    def __init__(self, link: LinkConfig, local_cluster: str, partition: int, data_dir: str,
                 domains: Callable[[], Mapping[str, DomainConfig]],
                 session_factory: Callable[[list[str]], Session] | None = None,
                 start_at: tuple[int, int] = (-1, -1), tls: ClientTls | None = None, token: str | None = None):
        """`start_at`: (PUT-log version, seq) a link that has never run starts
        after: a link added to a running cluster carries what is committed
        from then on, not the history before it."""
        self.link = link
        self.local_cluster = local_cluster
        self.partition = partition
        self.paths = tables.PartitionPaths(data_dir, partition)
        self.progress = Progress(progress_path(data_dir, partition, link.name))
        self.domains = domains
        self._session_factory = session_factory or (lambda hosts: Session(hosts, connect_timeout_s=2.0, tls=tls,
                                                                          token=token))
        self._session: Session | None = None
        self._queues: dict[tuple[str, str], Queue] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"link-{link.name}-{partition}", daemon=True)
        self._rules: dict[str, tuple[DomainConfig, AppRules]] = {}
        saved = self.progress.load()
        self.version, self.seq = start_at if saved is None else saved
        self.forwarded = 0          # messages the remote ACKed, since start
        self.rounds_failed = 0
        self.last_error = ""

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        self._stop_session()   # fails the round in flight: it is posted again after a restart
        self._thread.join(timeout_s)
        self._stop_session()   # one it made meanwhile

    def _stop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.stop(timeout_s=0.5)

    def notify(self) -> None:
        """A PUT commit happened: read it now."""
        self._wake.set()

    @property
    def needed_version(self) -> int:
        """The PUT-log version from which it still reads (log trimming keeps it)."""
        return self.version + 1

    # -- the loop -------------------------------------------------------------------
    def _run(self) -> None:
        table: DeltaTable | None = None
        while not self._stopping.is_set():
            try:
                if table is None:
                    table = deltars.try_open(self.paths.puts)
                if table is None:
                    self._wake.wait(IDLE_POLL_S)
                    self._wake.clear()
                    continue
                if not self._round(table):
                    self._wake.wait(IDLE_POLL_S)
                    self._wake.clear()
            except Exception as exc:   # the remote down or refusing, a read that failed: try again later
                if self._stopping.is_set():
                    return
                self.rounds_failed += 1
                text = f"{type(exc).__name__}: {exc}"
                if text != self.last_error or self.rounds_failed % 30 == 1:
                    log.warning("link %s (partition %d) to cluster %s: round failed, retrying every %.1f s: %s",
                                self.link.name, self.partition, self.link.cluster,
                                self.link.retry_interval_ms / 1000, text)
                self.last_error = text
                self._stopping.wait(self.link.retry_interval_ms / 1000)

    def _round(self, table: DeltaTable) -> bool:
        """Forward what was committed since the last round; False if there was nothing."""
        version, rows = self._read(table)
        if version <= self.version:
            return False
        rows = rows.filter(pc.greater(rows["seq"], self.seq)) if rows.num_rows else rows
        last_seq = self.seq
        if rows.num_rows:
            rows = rows.sort_by("seq")
            last_seq = max(last_seq, rows["seq"][-1].as_py())
            chosen = self.select(rows)
            for start in range(0, chosen.num_rows, self.link.batch_messages):
                self._post(chosen.slice(start, self.link.batch_messages))
        self.progress.save(version, last_seq)
        self.version, self.seq = version, last_seq
        self.last_error = ""
        return True

    def _read(self, table: DeltaTable) -> tuple[int, pa.Table]:
        """(the version read up to, the rows committed after `self.version`
        up to it). When those versions are no longer readable (the log
        trimmed or the files vacuumed while the link was down), the table's
        current rows after `self.seq` instead."""
        table.update_incremental()
        latest = table.version()
        if latest <= self.version:
            return latest, pa.table({})
        upto = min(latest, self.version + VERSIONS_PER_READ)
        try:
            reader = table.load_cdf(starting_version=self.version + 1, ending_version=upto,
                                    columns=[*READ_COLUMNS, "_change_type"])
            rows = deltars.without_views(pa.RecordBatchReader.from_stream(reader).read_all())
            rows = rows.filter(pc.equal(rows["_change_type"], "insert")).select(READ_COLUMNS)
            return upto, rows
        except Exception as exc:
            log.warning("link %s (partition %d): PUT-log versions %d-%d not readable (%s); reading the table's "
                        "rows after seq %d instead", self.link.name, self.partition, self.version + 1, upto, exc,
                        self.seq)
            version, rows = deltars.read_snapshot(table, READ_COLUMNS)
            return version, rows

    # -- what goes, and how --------------------------------------------------------
    def select(self, rows: pa.Table) -> pa.Table:
        """The rows this link forwards, each with the queue it has there
        (`remote_queue`) and `taproot.via` naming this cluster too: a few
        Arrow kernels for the lot (with `unmatched`, each row of a domain
        with app subscriptions is matched in Python)."""
        link = self.link
        rows = rows.combine_chunks()
        queue = rows["queue"]
        routed = pc.match_substring(queue, "@")
        keep = pc.and_(pc.is_in(rows["domain"], pa.array(list(link.domains), pa.string())),
                       pc.or_(pc.ends_with(queue, f"@{link.cluster}"), self._local(rows, routed)))
        keep = pc.and_(keep, pc.invert(been_through(rows, link.cluster)))   # it has been there: a loop
        chosen = rows.filter(keep)
        properties, property_types = via_added(chosen, self.local_cluster)
        return _forwarded(chosen, pc.replace_substring_regex(chosen["queue"], "@.*$", ""), properties,
                          property_types)

    def _local(self, rows: pa.Table, routed: pa.Array) -> pa.Array:
        """Which rows of local queues the link's `forward` mode sends."""
        forward = self.link.forward
        n = rows.num_rows
        if forward == "none":
            return pa.array([False] * n)
        local = pc.invert(routed)
        if forward == "all":
            return local
        domains = self.domains()
        wanted = set(self.link.domains)
        names, props, types = (rows[c].to_pylist() for c in ("domain", "properties", "property_types"))
        local_rows = local.to_pylist()
        return pa.array([bool(local_rows[i]) and names[i] in wanted
                         and not self._matched(domains.get(names[i]), props[i], types[i]) for i in range(n)])

    def _matched(self, domain: DomainConfig | None, props: Any, types: Any) -> bool:
        """Whether a local app subscription takes the message (`unmatched` links skip it)."""
        if domain is None:
            return True            # a domain removed from the config: not ours to judge, keep it here
        cached = self._rules.get(domain.name)
        if cached is None or cached[0] is not domain:
            cached = self._rules[domain.name] = (domain, AppRules(domain.apps, domain.subscriptions))
        rules = cached[1]
        return bool(rules.target_apps(lambda: from_wire(maps_to_wire(props, types))))

    def _post(self, rows: pa.Table) -> None:
        """Post `rows` to the remote cluster, a frame per queue, and wait until
        every one is ACKed there; raises if any is not."""
        if rows.num_rows == 0:
            return
        session = self._connect()
        futures = []
        keys = list(zip(rows["domain"].to_pylist(), rows["remote_queue"].to_pylist()))
        order: dict[tuple[str, str], list[int]] = {}
        for i, key in enumerate(keys):
            order.setdefault(key, []).append(i)
        for key, indexes in order.items():
            queue = self._queue(session, key)
            part = rows.take(pa.array(indexes, pa.int64())).select(
                ["guid", "payload", "properties", "property_types", "compression"])
            futures.append(queue.post_columns(part))
        deadline = time.monotonic() + ACK_TIMEOUT_S
        for future in futures:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        self.forwarded += rows.num_rows

    def _connect(self) -> Session:
        session = self._session
        if session is not None and not session._core.state.final:
            return session
        self._queues.clear()
        session = self._session_factory(list(self.link.hosts))
        session.start()
        if self._stopping.is_set():
            session.stop(timeout_s=0.5)
            raise errors.ConnectionError("the link is stopping")
        self._session = session
        log.info("link %s (partition %d): connected to cluster %s at %s", self.link.name, self.partition,
                 self.link.cluster, session.host)
        return session

    def _queue(self, session: Session, key: tuple[str, str]) -> Queue:
        queue = self._queues.get(key)
        if queue is None:
            try:
                queue = session.open_queue(f"taproot://{key[0]}/{key[1]}", write=True)
            except errors.TaprootError as exc:
                raise errors.ConnectionError(f"cluster {self.link.cluster} did not open taproot://{key[0]}/"
                                             f"{key[1]}: {exc}") from exc
            self._queues[key] = queue
        return queue


def _forwarded(rows: pa.Table, remote_queue: pa.Array, properties: pa.Array, property_types: pa.Array) -> pa.Table:
    return pa.table({
        "domain": rows["domain"], "queue": rows["queue"], "remote_queue": remote_queue, "guid": rows["guid"],
        "seq": rows["seq"], "payload": rows["payload"], "properties": properties,
        "property_types": property_types, "compression": rows["compression"]})


def been_through(rows: pa.Table, cluster: str) -> pa.Array:
    """Per row, whether its `taproot.via` names `cluster`."""
    via = pc.map_lookup(rows["properties"].combine_chunks(), pa.scalar(VIA), "first")
    return pc.fill_null(pc.match_substring_regex(via, rf"(^|,){re.escape(cluster)}(,|$)"), False)


def via_added(rows: pa.Table, cluster: str) -> tuple[pa.Array, pa.Array]:
    """The rows' `properties` and `property_types` with `cluster` appended
    to their `taproot.via` (a string property)."""
    properties = rows["properties"].combine_chunks()
    via = pc.map_lookup(properties, pa.scalar(VIA), "first")
    passed = pc.if_else(pc.is_null(via), pa.scalar(cluster), pc.binary_join_element_wise(via, pa.scalar(cluster), ","))
    strings = pa.array(["string"] * rows.num_rows, pa.string())
    return with_entry(properties, VIA, passed), with_entry(rows["property_types"].combine_chunks(), VIA, strings)


def with_entry(maps: pa.MapArray, key: str, values: pa.Array) -> pa.MapArray:
    """`maps` (map<string,string>) with `key` set to `values[i]` in row i:
    an entry of that key dropped, the new one last. By index arithmetic,
    with no Python object per row."""
    n = len(maps)
    if n == 0:
        return pa.array([], tables.PROPERTY_MAP)
    offsets = np.asarray(maps.offsets, np.int64)
    # A slice keeps its parent's entries: its offsets index them.
    base, end = int(offsets[0]), int(offsets[-1])
    offsets = offsets - base
    keys, items = maps.keys.slice(base, end - base), maps.items.slice(base, end - base)
    counts = np.diff(offsets)
    row_of_entry = np.repeat(np.arange(n), counts)
    kept = np.asarray(pc.fill_null(pc.not_equal(keys, pa.scalar(key)), True), bool)
    kept_index = np.nonzero(kept)[0]
    kept_counts = np.bincount(row_of_entry[kept_index], minlength=n)
    new_offsets = np.concatenate([[0], np.cumsum(kept_counts + 1)])
    first_kept = np.concatenate([[0], np.cumsum(kept_counts)[:-1]])
    rank = np.arange(len(kept_index)) - np.repeat(first_kept, kept_counts)
    gather = np.empty(int(new_offsets[-1]), np.int64)
    gather[new_offsets[row_of_entry[kept_index]] + rank] = kept_index
    gather[new_offsets[1:] - 1] = len(keys) + np.arange(n)
    index = pa.array(gather)
    all_keys = pa.concat_arrays([keys.cast(pa.string()), pa.array([key] * n, pa.string())]).take(index)
    all_items = pa.concat_arrays([items.cast(pa.string()), values.cast(pa.string())]).take(index)
    return pa.MapArray.from_arrays(pa.array(new_offsets, pa.int32()), all_keys, all_items).cast(tables.PROPERTY_MAP)


# -- pull links -------------------------------------------------------------------

PULL_WINDOW = 2000          # messages a puller may hold unconfirmed on the remote cluster
PULL_BATCH = 1000           # messages posted here per round


class PullLinks:
    """A partition's pull links (`direction = "pull"`): while a queue of a
    carried domain has consumers here (not themselves a link's), a `Puller`
    consumes it on the remote cluster with the union of their subscriptions
    (OpenAMQ's MTA carrying bindings upstream) and posts what comes here;
    when the last consumer goes, the puller goes too. Changes are applied by
    one thread, so the node's frame handlers never wait on the network."""

    def __init__(self, links: list[LinkConfig], local_cluster: str, partition: int,
                 local_address: Callable[[], str], tls: ClientTls | None = None,
                 tokens: Mapping[str, str | None] | None = None):
        """`tokens`: what each link's session presents, by link name ("": the
        session to this node itself: the cluster token)."""
        self.links = links
        self.tls = tls
        self.tokens = dict(tokens or {})
        self.local_cluster = local_cluster
        self.partition = partition
        self.local_address = local_address
        self._interest: dict[tuple[str, str, str], dict[Any, tuple[str, ...] | None]] = {}
        self._pullers: dict[tuple[str, tuple[str, str, str]], Puller] = {}
        self._sessions: dict[str, Session] = {}
        self._changes: "queue_module.SimpleQueue[tuple[str, str, str] | None]" = queue_module.SimpleQueue()
        self._lock = threading.Lock()            # the consumers' interest (taken by the node's frame handlers)
        self._session_lock = threading.Lock()    # the sessions (held while one connects)
        self._stopped = False
        self._thread = threading.Thread(target=self._apply, name=f"pull-links-{partition}", daemon=True)

    def carries(self, domain: str) -> bool:
        return any(domain in link.domains for link in self.links)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop every pull: their sessions first, so that no puller waits
        out an ACK or a PUSH; what they held unconfirmed goes back to its
        queue on the other cluster."""
        self._changes.put(None)
        self._thread.join(10)
        pullers = list(self._pullers.values())
        for puller in pullers:
            puller._stopping.set()
        with self._session_lock:
            self._stopped = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.stop(timeout_s=1.0)
        for puller in pullers:
            puller.stop()

    def consumer(self, domain: str, queue: str, app: str, key: Any, subscriptions: tuple[str, ...] | None) -> None:
        """A local consumer of taproot://domain/queue?id=app opened or changed
        (`subscriptions`: its expressions, None for everything)."""
        with self._lock:
            self._interest.setdefault((domain, queue, app), {})[key] = subscriptions
        self._changes.put((domain, queue, app))

    def consumer_gone(self, domain: str, queue: str, app: str, key: Any) -> None:
        with self._lock:
            consumers = self._interest.get((domain, queue, app))
            if consumers is None or key not in consumers:
                return
            del consumers[key]
            if not consumers:
                del self._interest[(domain, queue, app)]
        self._changes.put((domain, queue, app))

    def _wanted(self, target: tuple[str, str, str]) -> tuple[str, ...] | None | bool:
        """False: nobody here; None: everything; else the subscriptions' union."""
        with self._lock:
            consumers = self._interest.get(target)
            if not consumers:
                return False
            if any(s is None for s in consumers.values()):
                return None
            return tuple(sorted({text for s in consumers.values() if s for text in s}))

    def _apply(self) -> None:
        while True:
            target = self._changes.get()
            if target is None:
                return
            wanted = self._wanted(target)
            for link in self.links:
                if target[0] not in link.domains:
                    continue
                key = (link.name, target)
                puller = self._pullers.get(key)
                if wanted is False:
                    if puller is not None:
                        del self._pullers[key]
                        puller.stop()
                elif puller is None:
                    puller = self._pullers[key] = Puller(self, link, *target, wanted)   # type: ignore[arg-type]
                    puller.start()
                else:
                    puller.subscribe(wanted)                                          # type: ignore[arg-type]

    def session(self, name: str, hosts: list[str]) -> Session:
        """The session of a link (or "" for this node), made once (under its
        own lock: pullers starting together share it), reconnecting by itself."""
        with self._session_lock:
            if self._stopped:
                raise errors.ConnectionError("the pull links are stopping")
            session = self._sessions.get(name)
            if session is None or session._core.state.final:
                session = self._sessions[name] = Session(hosts, connect_timeout_s=2.0, tls=self.tls,
                                                         token=self.tokens.get(name))
                session.start()
            return session


class Puller:
    """One pulled queue: a consumer of it on the remote cluster (flagged as a
    link's), whose messages are posted here with their GUIDs and confirmed
    there once ACKed here. A message whose `taproot.via` names this cluster
    came from here: confirmed there, not posted again."""

    def __init__(self, links: PullLinks, link: LinkConfig, domain: str, queue: str, app: str,
                 subscriptions: tuple[str, ...] | None):
        self.links = links
        self.link = link
        self.remote_uri = f"taproot://{domain}/{queue}" + (f"?id={app}" if app else "")
        self.local_uri = f"taproot://{domain}/{queue}"
        self._subscriptions = subscriptions
        self._applied: tuple[str, ...] | None | bool = False
        self._remote: Queue | None = None
        self._local: Queue | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pull-{link.name}-{queue}", daemon=True)
        self.pulled = 0
        self.last_error = ""

    def start(self) -> None:
        self._thread.start()

    def subscribe(self, subscriptions: tuple[str, ...] | None) -> None:
        self._subscriptions = subscriptions   # applied by its thread

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(10)
        if self._remote is not None:
            try:
                self._remote.close(timeout_s=2.0)   # what it holds unconfirmed there goes back to that queue
            except errors.TaprootError:
                pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._round()
                self.last_error = ""
            except Exception as exc:   # either cluster down or refusing: try again
                if self._stopping.is_set():
                    return
                text = f"{type(exc).__name__}: {exc}"
                if text != self.last_error:
                    log.warning("pull link %s: %s from cluster %s: %s; retrying every %.1f s", self.link.name,
                                self.remote_uri, self.link.cluster, text, self.link.retry_interval_ms / 1000)
                self.last_error = text
                self._remote = None
                self._stopping.wait(self.link.retry_interval_ms / 1000)

    def _round(self) -> None:
        remote = self._remote
        if remote is None or self._applied != self._subscriptions:
            remote = self._open_remote()
        local = self._local
        if local is None:
            session = self.links.session("", [self.links.local_address()])
            local = self._local = session.open_queue(self.local_uri, write=True)
        batch = remote.get_columns(PULL_BATCH, timeout_s=0.5)
        if batch is None:
            return
        rows = batch.table
        rows = rows.filter(pc.invert(been_through(rows, self.links.local_cluster)))   # been here: a loop
        if rows.num_rows:
            properties, property_types = via_added(rows, self.link.cluster)
            local.post_columns(pa.table({"guid": rows["guid"], "payload": rows["payload"], "properties": properties,
                                         "property_types": property_types})).result(timeout=ACK_TIMEOUT_S)
        batch.confirm()
        self.pulled += rows.num_rows

    def _open_remote(self) -> Queue:
        if self._remote is not None:
            try:
                self._remote.configure(subscription=list(self._subscriptions or ()))
                self._applied = self._subscriptions
                return self._remote
            except errors.TaprootError:
                self._remote = None
        session = self.links.session(self.link.name, list(self.link.hosts))
        subscriptions = self._subscriptions
        self._remote = session.open_queue(self.remote_uri, read=True, max_unconfirmed_messages=PULL_WINDOW,
                                          subscription=list(subscriptions or ()) or None,
                                          _link=self.links.local_cluster)
        self._applied = subscriptions
        log.info("pull link %s: consuming %s on cluster %s for the consumers here%s", self.link.name,
                 self.remote_uri, self.link.cluster,
                 f" (subscriptions: {' || '.join(subscriptions)})" if subscriptions else "")
        return self._remote
