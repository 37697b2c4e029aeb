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
could lose every row in them. Otherwise delta-rs's optimize does the work.

Log trimming (`storage.deltars.trim_log`): a local table's commit and
refresh list all of `_delta_log/`, so the same thread deletes the log entries
no reader needs after each compaction: those before the newest checkpoint at
or below `log_needed_from()` and older than `log_retention_s`. For the PUT
log that is the older of the version before where the dedup stream would
resume and the judged version the primary last read from the delivery log
(`Partition._puts_log_needed_from`). With no `log_needed_from`, the newest
checkpoint bounds it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import RemoveAction

from storage import deltars

log = logging.getLogger(__name__)

TRIM_EVERY_COMMITS = 100   # log trimming's cadence when compaction is off
NO_READER = 1 << 62        # no reader bound: the newest checkpoint is the floor


class Compactor:
    def __init__(self, path: str, every_commits: int, name: str, target_file_bytes: int = 16 << 20,
                 durable: bool = True, log_retention_s: float | None = None,
                 log_needed_from: Callable[[], int | None] | None = None):
        """`every_commits` 0: no compaction. `log_retention_s` None: no log
        trimming; else it runs every `every_commits` commits (every
        `TRIM_EVERY_COMMITS` when compaction is off)."""
        self.path = path
        self.root = deltars.local_root(path) if durable else None
        self.log_root = deltars.local_root(path)
        self.compact = every_commits > 0
        self.every_commits = every_commits if every_commits > 0 else TRIM_EVERY_COMMITS
        self.target_file_bytes = target_file_bytes
        self.name = name
        self.log_retention_s = log_retention_s
        self.log_needed_from = log_needed_from
        self.compactions = 0
        self.trimmed_log_files = 0
        self._commits = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"compact-{name}", daemon=True)

    def start(self) -> None:
        if self.compact or self.trims:
            self._thread.start()

    @property
    def trims(self) -> bool:
        return self.log_retention_s is not None and self.log_root is not None

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def on_commit(self) -> None:
        """Called by the table's one writer thread after each commit."""
        self._commits += 1
        if self._commits >= self.every_commits:
            self._commits = 0
            self._wake.set()

    def compact_now(self) -> dict[str, Any]:
        table = DeltaTable(self.path)
        if self.root is not None:
            metrics = compact_durably(table, self.root, self.target_file_bytes)
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
        assert self.log_root is not None and self.log_retention_s is not None
        needed = NO_READER
        if self.log_needed_from is not None:
            bound = self.log_needed_from()
            if bound is None:
                return 0   # what the reader needs is not known: keep everything
            needed = bound
        removed = deltars.trim_log(self.log_root, needed, self.log_retention_s)
        self.trimmed_log_files += removed
        return removed

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
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


def compact_durably(table: DeltaTable, root: str, target_file_bytes: int) -> dict[str, Any]:
    """Rewrite the table's files smaller than `target_file_bytes` into files
    of about that size, each fsynced before the one commit that adds them and
    removes the small ones (dataChange=false), then fsync that commit.
    Returns optimize's metric names: numFilesAdded, numFilesRemoved."""
    files = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    sizes = dict(zip(files["path"], files["size_bytes"]))
    small = sorted((size, path) for path, size in sizes.items() if size < target_file_bytes)
    if len(small) < 2:
        return {"numFilesAdded": 0, "numFilesRemoved": 0}
    bins: list[list[str]] = [[]]
    filled = 0
    for size, path in small:
        if bins[-1] and filled + size > target_file_bytes:
            bins.append([])
            filled = 0
        bins[-1].append(path)
        filled += size
    bins = [b for b in bins if len(b) > 1]
    schema = pa.schema(table.schema().to_arrow())
    actions: list[Any] = []
    now_ms = int(time.time() * 1000)
    for paths in bins:
        rows = pa.concat_tables([pq.read_table(f"{root}/{p}").select(schema.names) for p in paths],
                                promote_options="permissive").cast(schema)
        add = deltars.write_data_file(root, rows)
        add.data_change = False
        actions.append(add)
        actions += [RemoveAction(p, False, now_ms, size=sizes[p]) for p in paths]
    deltars.commit_durably(table, root, actions, schema, CommitProperties(custom_metadata={COMPACTION_KEY: True}))
    return {"numFilesAdded": len(bins), "numFilesRemoved": sum(len(b) for b in bins)}
