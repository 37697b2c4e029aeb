"""Background upkeep of the tables the primary writes (delta-rs): compaction
of their small files and trimming of their logs.

Every group commit adds one small Parquet file. With nothing else, delta-rs's
commit cost grows with the file count (measured, 50-row commits on local disk:
p50 28 ms at 250 commits, 134 ms at 1,000, 212 ms at 1,500), and so does every
reader's. Compacting keeps it flat: every 250 commits, p50 ~31 ms; every 50,
p50 ~15 ms, each compaction ~110 ms in the background.

Compaction commits carry dataChange=false, so Spark streams reading the table
skip them, and they cannot conflict with blind appends. Removed files stay on
disk until a VACUUM (retention and vacuum are `pipelines/retention.py`'s job).

A durable compactor (local tables, `primary.durability = "fsync"`) writes its
output files and fsyncs them before it commits, then fsyncs the commit, as
`storage.deltars.Appender` does: delta-rs's optimize would commit the removal
of the small files before its new file is on disk, and a power loss then
could lose every row in them. It merges by level (`plan_compaction`), one
input file at a time and paced, so each row is rewritten a few times in all
and a merge does not take the cores from the commits at once. Otherwise
(object stores) delta-rs's optimize does the work, which merges every file
below the target each time.

Log trimming (`storage.deltars.trim_log`): a table's commit and refresh
list `_delta_log/` (a local one in full), so the same thread deletes the log entries
no reader needs after each compaction: those before the newest checkpoint at
or below `log_needed_from()` and older than `log_retention_s`. For the PUT
log that is the older of the version before where the dedup stream would
resume and the judged version the primary last read from the delivery log
(`Partition._puts_log_needed_from`). With no `log_needed_from`, the newest
checkpoint bounds it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from storage import deltars
from storage.worker import WakeThread

log = logging.getLogger(__name__)

TRIM_EVERY_COMMITS = 100   # log trimming's cadence when compaction is off
NO_READER = 1 << 62        # no reader bound: the newest checkpoint is the floor


class Compactor:
    def __init__(self, path: str, every_commits: int, name: str, target_file_bytes: int = 16 << 20,
                 durable: bool = True, log_retention_s: float | None = None,
                 log_needed_from: Callable[[], int | None] | None = None,
                 appender: deltars.Appender | None = None):
        """`every_commits` 0: no compaction. `log_retention_s` None: no log
        trimming; else it runs every `every_commits` commits (every
        `TRIM_EVERY_COMMITS` when compaction is off). `appender`: the
        table's, whose log the compactions commit through (`compact_durably`)."""
        self.path = path
        self.root = deltars.local_root(path) if durable else None
        self.compact = every_commits > 0
        self.every_commits = every_commits if every_commits > 0 else TRIM_EVERY_COMMITS
        self.target_file_bytes = target_file_bytes
        self.name = name
        self.log_retention_s = log_retention_s
        self.log_needed_from = log_needed_from
        self.appender = appender
        self.compactions = 0
        self.trimmed_log_files = 0
        self._commits = 0
        self._thread = WakeThread(f"compact-{name}", self._upkeep)

    def start(self) -> None:
        if self.compact or self.trims:
            self._thread.start()

    @property
    def trims(self) -> bool:
        return self.log_retention_s is not None

    def stop(self) -> None:
        self._thread.stop()

    def on_commit(self) -> None:
        """Called by the table's one writer thread after each commit."""
        self._commits += 1
        if self._commits >= self.every_commits:
            self._commits = 0
            self._thread.wake()

    def compact_now(self) -> dict[str, Any]:
        table = DeltaTable(self.path)
        if self.root is not None:
            metrics = compact_durably(table, self.root, self.target_file_bytes, appender=self.appender)
        else:
            metrics = table.optimize.compact(target_size=self.target_file_bytes)
        self.compactions += 1
        log.info("%s: compacted %d files into %d", self.name, metrics.get("numFilesRemoved", 0),
                 metrics.get("numFilesAdded", 0))
        return metrics

    def trim_log_now(self) -> int:
        """Trim the table's log (the module's docstring); returns the files deleted."""
        if not self.trims:
            return 0
        assert self.log_retention_s is not None
        needed = NO_READER
        if self.log_needed_from is not None:
            bound = self.log_needed_from()
            if bound is None:
                return 0   # what the reader needs is not known: keep everything
            needed = bound
        removed = deltars.trim_log(self.path, needed, self.log_retention_s)   # local or on an object store
        self.trimmed_log_files += removed
        return removed

    def _upkeep(self) -> None:
        if self.compact:
            try:
                self.compact_now()
            except Exception:
                # Not fatal: appends go on; the next trigger tries again.
                log.exception("%s: compaction failed; will retry after more commits", self.name)
        try:
            self.trim_log_now()
        except Exception:
            log.exception("%s: trimming the log failed; will retry after more commits", self.name)


COMPACTION_KEY = "taprootCompaction"   # in a durable compaction's commitInfo
LEVEL_PREFIX = "part-compacted-L"       # a durable compaction's output: part-compacted-L<level>-<uuid>-...
LEVEL_FANIN = 10                        # files of a level >= 1 merged once this many are below the target
_LEVEL = re.compile(r"(?:^|/)" + re.escape(LEVEL_PREFIX) + r"(\d+)-")
CHUNK_BYTES = 32 << 20                  # decoded bytes a compaction holds before it writes a row group
REST_RATIO = 3.0                        # a compaction rests 3x as long as each chunk took: 25% of a core
_rest = time.sleep                      # how a compaction rests between chunks (a test counts the rests)


def file_level(path: str) -> int:
    """How many compactions the rows of a data file have been through: 0 for
    a commit's own file (or one from before levels), else its name says."""
    match = _LEVEL.search(path)
    return int(match.group(1)) if match else 0


def plan_compaction(sizes: dict[str, int], target_file_bytes: int) -> list[tuple[int, list[str]]]:
    """Which files to merge, as (output level, input paths), by level as an
    LSM tree's size tiers do. Every commit file (level 0) below the target is
    merged, in bins of up to the target; level-L outputs are merged into
    level L+1 only once `LEVEL_FANIN` of them are below the target. So a row
    is rewritten about once per level, a handful of times in all, instead of
    at every compaction until its file reaches the target: with payloads
    that compress well, the single bin of every file below the target read
    and rewrote 50, 100, 150, ... thousand rows in turn (measured at 10k
    msg/s in `taproot bench`: the node's CPU with compaction 7.1-7.9 s in
    20 s, without 5.0 s)."""
    by_level: dict[int, list[tuple[int, str]]] = {}
    for path, size in sizes.items():
        if size < target_file_bytes:
            by_level.setdefault(file_level(path), []).append((size, path))
    plan: list[tuple[int, list[str]]] = []
    for level, files in sorted(by_level.items()):
        if len(files) < (2 if level == 0 else LEVEL_FANIN):
            continue
        bins: list[list[str]] = [[]]
        filled = 0
        for size, path in sorted(files):
            if bins[-1] and filled + size > target_file_bytes:
                bins.append([])
                filled = 0
            bins[-1].append(path)
            filled += size
        plan += [(level + 1, b) for b in bins if len(b) > 1]
    return plan


def _chunks(root: str, paths: list[str], schema: pa.Schema, rest_ratio: float = 0.0) -> Iterator[pa.Table]:
    """The rows of `paths`, read one file at a time, in chunks of about
    `CHUNK_BYTES` decoded, in `schema` (a file from before a column was added
    gets it as nulls). Paced: before each chunk after the first, it sleeps
    `rest_ratio` times the time the chunk before took to read and write, and
    it reads on one thread, so a large merge is spread out rather than taking
    the cores from the commits at once (a level-2 merge at 10k msg/s reads
    500,000 rows)."""
    held: list[pa.Table] = []
    held_bytes = 0
    busy_since = time.perf_counter()
    for path in paths:
        held.append(deltars.read_data_file(root, path, schema))
        held_bytes += held[-1].nbytes
        if held_bytes >= CHUNK_BYTES:
            yield pa.concat_tables(held)
            held, held_bytes = [], 0
            if rest_ratio:
                _rest((time.perf_counter() - busy_since) * rest_ratio)
            busy_since = time.perf_counter()
    if held:
        yield pa.concat_tables(held)


def compact_durably(table: DeltaTable, root: str, target_file_bytes: int,
                    rest_ratio: float = REST_RATIO, appender: deltars.Appender | None = None) -> dict[str, Any]:
    """Merge the files `plan_compaction` picks. Each output is written a
    chunk at a time (paced by `rest_ratio`, `_chunks`) and fsynced before
    the one commit that adds the outputs and removes their inputs
    (dataChange=false); then that commit is fsynced. With the table's
    `appender`, that commit goes through its `LocalLog` when it has one
    whose knowledge is fresh: through delta-rs, from the snapshot read at
    the compaction's start, the commit held the appender's commit lock for
    149-355 ms (it replays every append since), and every append waited.
    Returns optimize's metric names: numFilesAdded, numFilesRemoved."""
    files = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    sizes = dict(zip(files["path"], files["size_bytes"]))
    plan = plan_compaction(sizes, target_file_bytes)
    if not plan:
        return {"numFilesAdded": 0, "numFilesRemoved": 0}
    schema = pa.schema(table.schema().to_arrow())
    actions: list[Any] = []
    now_ms = int(time.time() * 1000)
    for level, paths in plan:
        add = deltars.write_data_file_from(root, schema, _chunks(root, paths, schema, rest_ratio),
                                           f"{LEVEL_PREFIX}{level}")
        add.data_change = False
        actions.append(add)
        actions += [RemoveAction(p, False, now_ms, size=sizes[p]) for p in paths]
    local = appender.log if appender is not None else None
    if local is not None and local.fresh():
        local.commit_actions({"operation": "OPTIMIZE", "operationParameters": {}, COMPACTION_KEY: True},
                             [deltars.add_action_json(a) if isinstance(a, AddAction) else
                              deltars.remove_action_json(a.path, a.size, now_ms, data_change=False) for a in actions],
                             removes=frozenset(a.path for a in actions if isinstance(a, RemoveAction)),
                             read_version=table.version())
    else:
        with appender.commit_lock if appender is not None and appender.commit_lock else contextlib.nullcontext():
            deltars.commit_files(table, actions, schema, CommitProperties(custom_metadata={COMPACTION_KEY: True}),
                                 sync_root=root)
    return {"numFilesAdded": len(plan), "numFilesRemoved": sum(len(p) for _, p in plan)}
