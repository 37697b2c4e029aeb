"""delta-rs access for the tables the primary owns (puts, confirms) and reads.

`Appender` keeps one `DeltaTable` handle open: reusing it halves commit latency
compared with reopening by URI (reference/spark-delta.md §4: 17 ms vs 37 ms p50).
Not thread safe: one thread owns an `Appender`.

Durability. delta-rs writes local files without fsync, so a commit it reports
may still be in the page cache: a power loss could lose an ACKed PUT, or keep
a commit whose data file was lost (a table no reader can open). A durable
`Appender` (the default for local tables, `primary.durability = "fsync"`)
therefore writes each commit in order:

1. the Parquet data file, by pyarrow, then fsync of the file and its directory;
2. the commit file, with that file's add action and the same statistics
   delta-rs computes (`delta_stats`): written and fsynced under a temp name,
   then linked to its version's name (put-if-absent), then `_delta_log/`
   fsynced (`LocalLog`; through delta-rs, `create_write_transaction` and then
   the fsyncs, for a table whose protocol `LocalLog` does not write).

Only then does `append` return, and the caller ACK. Object stores (s3://, ...)
acknowledge a PUT once it is stored, so they keep delta-rs's own writer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import threading
import time
import urllib.parse
import uuid
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Schema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction

from protocol.metrics import LATENCY_BUCKETS, WeightedHistogram
from storage.leases import FencedAppender
from storage.tables import PRIMARY_TABLE_PROPERTIES
from storage.worker import WakeThread

log = logging.getLogger(__name__)


def set_aside_torn_commit(root: str) -> str | None:
    """A power loss between delta-rs writing a commit file and its fsync can
    leave that file empty or cut short: delta-rs then treats it as an empty
    commit or cannot open the table at all. Only the newest commit can be in
    that state, and with `durability = "fsync"` its PUTs were never ACKed
    (the ACK waits for the fsync), so it is renamed aside (`.torn`) and the
    table opens at the version before it. Returns the file set aside."""
    log_dir = os.path.join(root, "_delta_log")
    try:
        commits = sorted(n for n in os.listdir(log_dir) if len(n) == 25 and n.endswith(".json") and n[:20].isdigit())
    except OSError:
        return None
    if not commits:
        return None
    newest = os.path.join(log_dir, commits[-1])
    try:
        with open(newest, "rb") as fh:
            lines = [line for line in fh.read().splitlines() if line.strip()]
        if lines:
            for line in lines:
                json.loads(line)
            return None
    except (OSError, ValueError):
        pass
    os.replace(newest, newest + ".torn")
    fsync_path(log_dir)
    log.error("%s: commit %s was cut short (a power loss before its fsync); set aside as %s.torn. With "
              "durability = \"os\", PUTs it held may have been ACKed", root, commits[-1], commits[-1])
    return newest + ".torn"


def open_or_create(path: str, schema: pa.Schema, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """A table the primary writes, with `PRIMARY_TABLE_PROPERTIES` (set on a
    table an older release made, once) and the columns of `schema`."""
    root = local_root(path)
    if root is not None:
        set_aside_torn_commit(root)
    try:
        table = DeltaTable(path, storage_options=storage_options)
    except TableNotFoundError:
        # mode="ignore": if a concurrent creator won, keep its table.
        return DeltaTable.create(path, schema, mode="ignore", configuration=PRIMARY_TABLE_PROPERTIES,
                                 storage_options=storage_options)
    set_properties(table, PRIMARY_TABLE_PROPERTIES)
    add_missing_columns(table, schema)
    return table


def set_properties(table: DeltaTable, wanted: Mapping[str, str]) -> bool:
    """Give `table` these properties: one metadata commit of those that
    differ, none if none does. True if it committed."""
    configuration = table.metadata().configuration
    changed = {k: v for k, v in wanted.items() if configuration.get(k) != v}
    if changed:
        table.alter.set_table_properties(changed)
    return bool(changed)


def add_missing_columns(table: DeltaTable, schema: pa.Schema) -> None:
    """Schema evolution for a table made by an older Taproot: add the columns
    this version writes (nullable, appended at the end; old rows read null)."""
    existing = set(table.schema().to_arrow().names)
    missing = [f for f in schema if f.name not in existing]
    if missing:
        fields = Schema.from_arrow(pa.schema([f.with_nullable(True) for f in missing])).fields
        table.alter.add_columns(fields)


def try_open(path: str, storage_options: dict[str, str] | None = None) -> DeltaTable | None:
    try:
        return DeltaTable(path, storage_options=storage_options)
    except TableNotFoundError:
        return None


APPEND_ATTEMPTS = 5
# A commit's files reserved longer ago than this are not used (`Appender.reserve`):
# far below the age past which vacuum removes a stray (an hour and more).
RESERVED_MAX_AGE_S = 60.0


def local_root(path: str) -> str | None:
    """The directory of a table on the local file system, None for an object store."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


def file_system(path: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for `path` (a local path or an object store's
    URI, reached with the AWS_* settings `conf.use_storage` put in the
    environment) and the path within it."""
    local = local_root(path)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(local)
    store, within = pafs.FileSystem.from_uri(path.rstrip("/"))
    return store, str(within)


def _local_log_entry(root: str, version: int) -> bytes:
    """The bytes of one version's commit file in a local table's log
    (FileNotFoundError if it is not there)."""
    with open(os.path.join(root, "_delta_log", f"{version:020d}.json"), "rb") as fh:
        return fh.read()


def has_commit(path: str, version: int) -> bool:
    """Whether the table at `path` has a commit file for `version`: one
    `stat` (or an object store's HEAD), where a delta-rs refresh lists the
    whole log (on a local disk, every entry). A reader polling for the next
    version asks this first."""
    name = f"_delta_log/{version:020d}.json"
    root = local_root(path)
    if root is not None:
        return os.path.isfile(os.path.join(root, name))
    store, base = file_system(path)
    try:
        return bool(store.get_file_info(f"{base}/{name}").type == pafs.FileType.File)
    except OSError:
        return False


def commit_info(table: DeltaTable, version: int) -> dict[str, Any] | None:
    """The commitInfo of one version, read from its log file; None if the
    file is gone (log cleanup) or holds none. delta-rs's `history()` cannot
    be used for this: it lists the log's newest commits but numbers them from
    the version the table object has loaded, so once the log has moved on it
    puts one commit's metadata under another's version (deltalake 1.6)."""
    uri = table.table_uri
    root = local_root(uri)
    try:
        if root is not None:
            data = _local_log_entry(root, version)
        else:
            store, base = file_system(uri)
            with store.open_input_stream(f"{base}/_delta_log/{version:020d}.json") as stream:
                data = stream.read()
    except OSError:
        return None
    for line in data.splitlines():
        try:
            action = json.loads(line) if line.strip() else {}
        except ValueError:
            continue   # a line cut short: no commitInfo from it
        if isinstance(action, dict) and isinstance(action.get("commitInfo"), dict):
            info: dict[str, Any] = action["commitInfo"]
            return info
    return None


# Every fsync this process makes on its tables (data files, commits, their
# directories, checkpoints, compactions), timed: the disk's sync latency,
# which a durable commit waits for three times over
# (`taproot_fsync_seconds`; the bench prints the share over 10 ms).
FSYNC_SECONDS = WeightedHistogram(LATENCY_BUCKETS)


def fsync(fd: int) -> None:
    """`os.fsync`, timed into `FSYNC_SECONDS`."""
    started = time.perf_counter()
    os.fsync(fd)
    FSYNC_SECONDS.observe(time.perf_counter() - started)


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a directory's fsync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


STRING_STAT_BYTES = 64   # delta-rs keeps at most this many bytes of a string's min or max


def _utf8_prefix(text: str, limit: int) -> str:
    """The longest prefix of `text` that is at most `limit` bytes in UTF-8."""
    size = 0
    for i, char in enumerate(text):
        size += len(char.encode())
        if size > limit:
            return text[:i]
    return text


def _next_char(char: str) -> str | None:
    """The next code point, if it is a character of the same UTF-8 length, else None."""
    code = ord(char) + 1
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF or len(chr(code).encode()) != len(char.encode()):
        return None
    return chr(code)


def _string_bound(text: str, upper: bool) -> str:
    """A string statistic as delta-rs writes it: a long min is cut to its
    first 64 bytes (a prefix sorts first); a long max is cut too and its last
    character that can be is incremented, so it still sorts after every value
    it stands for, or kept whole when none can be."""
    if len(text.encode()) <= STRING_STAT_BYTES:
        return text
    prefix = _utf8_prefix(text, STRING_STAT_BYTES)
    if not upper:
        return prefix
    for i in range(len(prefix) - 1, -1, -1):
        successor = _next_char(prefix[i])
        if successor is not None:
            return prefix[:i] + successor
    return text


def _stat_value(value: object, upper: bool) -> object:
    if isinstance(value, dt.datetime):
        # delta-rs's format: milliseconds, UTC, "Z" (readers widen the max by 1 ms).
        value = value.astimezone(dt.timezone.utc)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    if isinstance(value, str):
        return _string_bound(value, upper)
    return value


def _has_stats(data_type: pa.DataType) -> bool:
    """Columns delta-rs keeps statistics for: primitive, not binary, not nested."""
    return not (pa.types.is_nested(data_type) or pa.types.is_binary(data_type)
                or pa.types.is_large_binary(data_type) or pa.types.is_fixed_size_binary(data_type))


class Stats:
    """A file's statistics as delta-rs writes them into its add action,
    gathered over the batches written to it: numRecords, and per primitive
    column its null count and, unless all null, its min and max
    (`tests/test_durability.py` checks they are the same as delta-rs's)."""

    def __init__(self, schema: pa.Schema):
        self.columns = [f.name for f in schema if _has_stats(f.type)]
        self.rows = 0
        self.nulls = dict.fromkeys(self.columns, 0)
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}

    def add(self, batch: pa.Table) -> None:
        self.rows += batch.num_rows
        for name in self.columns:
            column = batch[name]
            self.nulls[name] += column.null_count
            if column.null_count < len(column):
                bounds = pc.min_max(column)
                low, high = bounds["min"].as_py(), bounds["max"].as_py()
                if name not in self.minimum or low < self.minimum[name]:
                    self.minimum[name] = low
                if name not in self.maximum or high > self.maximum[name]:
                    self.maximum[name] = high

    def json(self) -> str:
        return json.dumps({"numRecords": self.rows,
                           "minValues": {k: _stat_value(v, upper=False) for k, v in self.minimum.items()},
                           "maxValues": {k: _stat_value(v, upper=True) for k, v in self.maximum.items()},
                           "nullCount": self.nulls}, separators=(",", ":"))


def delta_stats(batch: pa.Table) -> str:
    """One batch's `Stats`, as JSON."""
    stats = Stats(batch.schema)
    stats.add(batch)
    return stats.json()


def data_file_name(name_prefix: str = "part-00000") -> str:
    """A new data file's name: `name_prefix`-<uuid>-c000.snappy.parquet."""
    return f"{name_prefix}-{uuid.uuid4()}-c000.snappy.parquet"


def write_data_file(root: str, batch: pa.Table, durable: bool = True, name: str | None = None,
                    entry_durable: bool = False) -> AddAction:
    """Write `batch` as one Parquet file in the table `root` (a local
    directory or an object store's URI) and return its add action; on a
    local disk with `durable`, the file and its directory entry are fsynced
    first. `name`: a file `reserve_data_file` made (else a new name);
    `entry_durable`: that file's directory entry is durable already (it
    was reserved with `durable`), so only its bytes are fsynced."""
    return write_data_file_from(root, batch.schema, [batch], durable=durable, name=name,
                                entry_durable=entry_durable)


def reserve_data_file(root: str, durable: bool = False) -> str:
    """Create an empty data file in the local table `root` and return its
    name, for a `write_data_file` to come: a file's creation can be slow
    (on ext4 without a journal, for about 40 s after many deletes, it scans
    past the inodes just freed: 0.4-1.1 ms a create against 23-43 us,
    `taproot_ops/bench/settling.py`), and a reserved file moves that cost
    off the commit's path. With `durable`, the directory is fsynced too, so
    the file's entry is durable before the commit writes it, and the commit
    fsyncs the file's bytes only: one fsync fewer on its path, where each
    is a chance to wait out the disk's stalls (`docs/benchmarks.md`). An
    unused one is a stray that no commit names (vacuum removes those past
    its age bound, far past `RESERVED_MAX_AGE_S`)."""
    name = data_file_name()
    os.close(os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    if durable:
        fsync_path(root)
    return name


def write_data_file_from(root: str, schema: pa.Schema, batches: Iterable[pa.Table],
                         name_prefix: str = "part-00000", durable: bool = True, name: str | None = None,
                         entry_durable: bool = False) -> AddAction:
    """`write_data_file` for batches that come one at a time (a compaction
    reads its inputs one file at a time, so its memory stays bounded); each
    batch becomes a row group or more. The file is `name_prefix`-<uuid>."""
    name = name or data_file_name(name_prefix)
    # Dictionaries for strings only and Parquet statistics only where Delta
    # keeps them: trying to dictionary-encode 1 KiB payloads and computing
    # min/max of binary columns more than doubled the write's CPU (5,000 rows:
    # 7.8 ms -> 3.4 ms).
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    stats = Stats(schema)

    def write(sink: Any) -> None:
        with pq.ParquetWriter(sink, schema, compression="snappy", use_dictionary=strings,
                              write_statistics=stats.columns) as writer:
            for batch in batches:
                writer.write_table(batch)
                stats.add(batch)

    local = local_root(root)
    if local is None:
        # An object store: one PUT of the whole object when the stream closes.
        store, base = file_system(root)
        with store.open_output_stream(f"{base}/{name}") as stream:
            write(stream)
            size = stream.tell()
        return AddAction(name, size, {}, int(time.time() * 1000), True, stats.json())
    # Arrow's own file sink, not a Python file object: the writer then calls
    # no Python for each page it writes. Each such call took the GIL back from
    # whichever thread had it, and a commit thread that gives the GIL up and
    # waits for it again pays the other threads' turns, dozens of times a
    # commit (`taproot_ops.bench.commits --contend`).
    path = os.path.join(local, name)
    with pa.OSFile(path, "wb") as sink:
        write(sink)
        size = sink.tell()
    if durable:
        fsync_path(path)
        if not entry_durable:
            fsync_path(local)
    return AddAction(name, size, {}, int(time.time() * 1000), True, stats.json())


def sync_log(root: str, version: int) -> None:
    """Make commit `version` durable: its JSON, the checkpoint it may have
    made (with `_last_checkpoint`), then the `_delta_log/` directory."""
    log_dir = os.path.join(root, "_delta_log")
    fsync_path(os.path.join(log_dir, f"{version:020d}.json"))
    checkpoint = os.path.join(log_dir, f"{version:020d}.checkpoint.parquet")
    if os.path.exists(checkpoint):
        fsync_path(checkpoint)
        fsync_path(os.path.join(log_dir, "_last_checkpoint"))
    fsync_path(log_dir)


def commit_files(table: DeltaTable, actions: list[Any], schema: pa.Schema,
                 commit_properties: CommitProperties | None = None,
                 post_commithook_properties: PostCommitHookProperties | None = None,
                 sync_root: str | None = None, settle: bool = True) -> int:
    """Commit add (and remove) actions for files already written
    (`write_data_file`) and return the version; with `sync_root` (a local
    table's directory) the commit is made durable too (`sync_log`). One
    transaction of the given actions: `write_deltalake` would do the same
    commit at a cost that grows with the table's file count (600 appends of
    1,000 rows with no compaction: 18 -> 66 ms of CPU per commit, against a
    flat 11 here; `taproot_ops.bench.commits --compact-every 0`).

    The handle does not move to the version it committed: by default it is
    updated (`update_incremental`, 3-8 ms of a 10-16 ms commit here). With
    `settle=False` on a local table, the version is read from the log
    instead (`committed_version`) and the handle stays where it was: the
    caller answers first and must update the handle before its next commit
    on it (`Appender.settle`)."""
    before = table.version()
    table.create_write_transaction(actions, "append", schema, commit_properties=commit_properties,
                                   post_commithook_properties=post_commithook_properties)
    version = None
    if not settle and sync_root is not None and actions:
        version = committed_version(sync_root, before, actions[0].path)
    if version is None:
        table.update_incremental()
        version = table.version()
    if sync_root is not None:
        sync_log(sync_root, version)
    return version


def committed_version(root: str, after: int, path: str) -> int | None:
    """The version, after `after`, of the commit that names data file `path`
    (a local table's `_delta_log`, read in version order from `after` + 1
    until a version is missing), or None if none does."""
    needle = json.dumps(path).encode()   # as the commit's JSON quotes it
    version = after + 1
    while True:
        try:
            entry = _local_log_entry(root, version)
        except FileNotFoundError:
            return None
        if needle in entry:
            return version
        version += 1


_LOG_ENTRY = re.compile(r"^(\d{20})\.")


def trim_log(root: str, needed_from: int, min_age_s: float, now: float | None = None) -> int:
    """Delete the `_delta_log/` entries of a table that no reader needs any
    more; return how many files went. `root`: a local directory or an
    object store's URI (`s3://bucket/table`).

    Why: every delta-rs refresh and commit lists `_delta_log/` (on a local
    file system in full, filtering from the offset; on S3 from the offset)
    and a log nobody cleans makes each commit slower as the table ages
    (`taproot_ops.bench.commits --no-trim`), and costs an object per commit
    on a store for good. Delta's own cleanup keeps by age only (30 days by
    default: 50M files at 20 commits per second).

    Kept: the newest checkpoint at or below `needed_from` (any version from
    `needed_from` on can be rebuilt from it and the commits after it, and a
    stream resuming at `needed_from` finds that commit and all later ones),
    everything after that checkpoint, and every entry younger than
    `min_age_s` (a reader that listed the log a moment ago still finds the
    files it listed). Oldest first, so the log stays one contiguous run of
    versions at every moment. Without a checkpoint at or below `needed_from`
    nothing is deleted."""
    store, base = file_system(root)
    log_dir = f"{base}/_delta_log"
    try:
        listed = store.get_file_info(pafs.FileSelector(log_dir))
    except OSError:
        return 0
    entries: dict[int, list[pafs.FileInfo]] = {}
    checkpoints: list[int] = []
    for info in listed:
        match = _LOG_ENTRY.match(info.base_name)
        if match is None or info.type != pafs.FileType.File:
            continue   # _last_checkpoint, temporary files, directories
        version = int(match.group(1))
        entries.setdefault(version, []).append(info)
        if ".checkpoint." in info.base_name:
            checkpoints.append(version)
    floor = max((v for v in checkpoints if v <= needed_from), default=None)
    if floor is None:
        return 0
    cutoff_ns = int(((time.time() if now is None else now) - min_age_s) * 1e9)
    removed = 0
    for version in sorted(v for v in entries if v < floor):
        for info in sorted(entries[version], key=lambda i: i.base_name):
            if info.mtime_ns is None or info.mtime_ns > cutoff_ns:
                return removed   # younger from here on
            try:
                store.delete_file(info.path)
            except FileNotFoundError:
                continue   # another trimmer got there first
            removed += 1
    return removed


# What `LocalLog` writes itself: a table of reader version 1 and a legacy
# writer version up to 4 (appendOnly, invariants, check constraints, change
# data feed, generated columns), none of whose constraints, invariants or
# generated columns is set. A blind append of new files needs nothing more;
# any other table commits through delta-rs.
LOCAL_LOG_MAX_WRITER_VERSION = 4
# A local log refreshes what it knows of the table through delta-rs when its
# knowledge of the latest version is older than this. Log trimming keeps every
# entry younger than `primary.log_retention_s` (5 s at the least), so no
# version after the last one seen this recently can have been trimmed away:
# the put-if-absent of the next version cannot land in a gap.
LOCAL_LOG_FRESH_S = 1.0
ENGINE_INFO = "taproot"


def local_log_refusal(table: DeltaTable) -> str | None:
    """Why `LocalLog` must not write this table's commits (None: it may)."""
    protocol = table.protocol()
    if protocol.min_reader_version > 1 or protocol.min_writer_version > LOCAL_LOG_MAX_WRITER_VERSION \
            or protocol.writer_features or protocol.reader_features:
        return f"protocol {protocol}"
    metadata = table.metadata()
    if metadata.partition_columns:
        return "partitioned"
    if any(k.startswith("delta.constraints.") for k in metadata.configuration):
        return "check constraints"
    for field in json.loads(table.schema().to_json())["fields"]:
        if any(k.startswith(("delta.invariants", "delta.generationExpression")) for k in field.get("metadata", {})):
            return f"invariant or generated column {field['name']}"
    return None


def add_action_json(add: AddAction) -> dict[str, Any]:
    """An add action as its line in a commit file."""
    return {"add": {"path": add.path, "partitionValues": add.partition_values or {}, "size": add.size,
                    "modificationTime": add.modification_time, "dataChange": add.data_change, "stats": add.stats}}


def remove_action_json(path: str, size: int, deletion_ms: int, data_change: bool) -> dict[str, Any]:
    return {"remove": {"path": path, "deletionTimestamp": deletion_ms, "dataChange": data_change,
                       "extendedFileMetadata": True, "partitionValues": {}, "size": size}}


class LogChanged(Exception):
    """A commit since this log's last one changed the table's protocol or
    metadata: what may be written must be checked again."""


class LocalLog:
    """Blind appends written straight into a local table's `_delta_log`.

    delta-rs's commit costs 11-14 ms of CPU per commit here, whatever its size
    (it rebuilds its snapshot around the commit, and `update_incremental`
    replays the log since the last checkpoint); a commit is one small JSON
    file, put-if-absent, 0.5 ms of CPU with its fsyncs
    (`taproot_ops.bench.commits`). So the primary's appends to its local
    tables write that file themselves, as delta-rs and Spark do: the
    commit's actions to a hidden temp file, fsynced, then `link`ed to
    `NNN.json`, which fails if the version exists (atomic put-if-absent on a
    local file system), then the directory fsynced.

    A version that exists was committed by another writer (retention, a
    newer primary's claim, a compaction through delta-rs): its actions are
    read, a newer primary epoch raises `Fenced`, a protocol or metadata
    change raises `LogChanged`, anything else is skipped and the next
    version tried. A blind append conflicts with nothing else; a
    compaction's commit (`commit_actions` with `removes`) also with a
    commit that removed one of its inputs. delta-rs still creates the
    table, claims it and writes its checkpoints (`Appender`)."""

    def __init__(self, root: str, version: int, durable: bool, fence: FencedAppender | None):
        self.root = root
        self.log_dir = os.path.join(root, "_delta_log")
        self.durable = durable
        self.fence = fence
        self.version = version                  # the latest version known
        self.known_at = time.monotonic()        # when that was last true
        # Held for each commit. A writer of this process that commits through
        # delta-rs (a compactor whose log is not fresh) holds it too: delta-rs
        # retries a lost race only so often (15), and these commits come
        # faster than its retries.
        self.lock = threading.Lock()
        self._tail = "" if fence is None else json.dumps(fence.txn_action(), separators=(",", ":")) + "\n"

    def fresh(self) -> bool:
        return time.monotonic() - self.known_at < LOCAL_LOG_FRESH_S

    def learn(self, version: int) -> None:
        """Delta-rs read the table at `version`, its latest."""
        self.version, self.known_at = max(self.version, version), time.monotonic()

    def reserve_temp(self) -> str:
        """Create an empty temp file for a commit to come (`commit`'s
        `temp`), off its path, as `reserve_data_file` does for its data
        file. An unused one is a leftover (`remove_leftovers`)."""
        temp = self._temp_name()
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return temp

    def _temp_name(self) -> str:
        return os.path.join(self.log_dir, f".taproot-{uuid.uuid4().hex}.json.tmp")

    def commit(self, adds: list[AddAction], temp: str | None = None) -> int:
        """Commit `adds` (files already written) as the next version; return
        it. `temp`: a file `reserve_temp` made (consumed either way)."""
        return self.commit_actions({"operation": "WRITE", "operationParameters": {"mode": "Append"},
                                    "isBlindAppend": True}, [add_action_json(a) for a in adds], reserved=temp)

    def commit_actions(self, info: dict[str, Any], actions: list[dict[str, Any]],
                       removes: frozenset[str] = frozenset(), read_version: int | None = None,
                       reserved: str | None = None) -> int:
        """Commit `actions` with `info` in the commitInfo as the next version.
        `removes`: the paths the commit removes (a compaction's inputs, read
        from the table at `read_version`): a commit after `read_version`
        that removed one of them first is a conflict (`CommitFailedError`),
        as delta-rs would judge it. The rows of a removed input may have
        been deleted (retention rewrites files): merged back, they would
        come back. `reserved`: the temp file to write the commit into
        (`reserve_temp`); else one is created."""
        info = {"commitInfo": {"timestamp": int(time.time() * 1000), **info, "engineInfo": ENGINE_INFO,
                               "clientVersion": ENGINE_INFO}}
        body = ("\n".join(json.dumps(a, separators=(",", ":")) for a in [info, *actions]) + "\n"
                + self._tail).encode()
        fd = -1
        if reserved is not None:
            try:
                fd = os.open(reserved, os.O_WRONLY | os.O_TRUNC)
                temp = reserved
            except FileNotFoundError:   # removed as a leftover meanwhile: a new one
                pass
        if fd < 0:
            temp = self._temp_name()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
            if self.durable:
                fsync(fd)
        finally:
            os.close(fd)
        try:
            with self.lock:
                if removes and read_version is not None:
                    for version in range(read_version + 1, self.version + 1):
                        self._check(version, removes)
                return self._link(temp, removes)
        finally:
            # Gone already if a new primary opening the table removed it as
            # a leftover: once linked, the commit stands all the same.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def _link(self, temp: str, removes: frozenset[str]) -> int:
        while True:
            version = self.version + 1
            try:
                os.link(temp, os.path.join(self.log_dir, f"{version:020d}.json"))
            except FileExistsError:
                self._skip(version, removes)
                continue
            self.version, self.known_at = version, time.monotonic()
            if self.durable:
                fsync_path(self.log_dir)
            return version

    def _skip(self, version: int, removes: frozenset[str]) -> None:
        """Another writer's commit at `version`: check it, then move past it."""
        self._check(version, removes)
        self.version, self.known_at = version, time.monotonic()

    def _check(self, version: int, removes: frozenset[str]) -> None:
        """Raise if the commit at `version` fences this primary, changed the
        table's protocol or metadata, or removed one of `removes`."""
        try:
            entry = _local_log_entry(self.root, version)
        except FileNotFoundError as exc:
            raise CommitFailedError(f"{self.root}: version {version} is gone; cannot check it") from exc
        actions = [json.loads(line) for line in entry.splitlines() if line.strip()]
        if self.fence is not None:
            self.fence.check_actions(actions)
        if any("protocol" in a or "metaData" in a for a in actions):
            raise LogChanged(f"{self.root}: version {version} changed the table's protocol or metadata")
        if removes and any(isinstance(a.get("remove"), dict) and a["remove"].get("path") in removes for a in actions):
            raise CommitFailedError(f"{self.root}: version {version} removed a file this commit removes")

    @staticmethod
    def remove_leftovers(root: str) -> None:
        """Temp files of a writer that died before its link: never commits."""
        log_dir = os.path.join(root, "_delta_log")
        try:
            names = [n for n in os.listdir(log_dir) if n.startswith(".taproot-") and n.endswith(".json.tmp")]
        except OSError:
            return
        for name in names:
            try:
                os.unlink(os.path.join(log_dir, name))
            except FileNotFoundError:
                pass


def read_data_file(root: str, path: str, schema: pa.Schema) -> pa.Table:
    """One data file's rows in `schema` (its columns only), from the local
    table at `root` (its callers, compaction, `delete_rows` and `LogTail`,
    read local tables only): a file from before a column was added gets it
    as nulls. The file is read whole, then decoded from memory:
    `pq.read_table`'s dataset machinery cost the process 4x the CPU for the
    small files compaction merges (0.85 against 0.20 ms for a file of one
    row, 0.89 against 0.25 for 120 rows, 7.7 against 4.8 ms for 10,000 rows
    of 1 KiB)."""
    with open(os.path.join(root, path), "rb") as fh:
        data = fh.read()
    parquet = pq.ParquetFile(pa.BufferReader(data))
    present = set(parquet.schema_arrow.names)
    rows = parquet.read(columns=[name for name in schema.names if name in present], use_threads=False)
    for field in schema:
        if field.name not in rows.column_names:
            rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
    return rows.select(schema.names).cast(schema)


_DATA_FILE_NAME = re.compile(r"^(.+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-c000\.")
CHANGE_DATA_DIR = "_change_data"
DELETE_ATTEMPTS = 20


def _write_change_data(root: str, rows: pa.Table, change_type: str) -> dict[str, Any]:
    """Write `rows` as a change data file (`_change_data/`, with their
    `_change_type`), fsynced with its directory; return its `cdc` action."""
    directory = os.path.join(root, CHANGE_DATA_DIR)
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    name = f"{CHANGE_DATA_DIR}/cdc-00000-{uuid.uuid4()}.c000.snappy.parquet"
    rows = rows.append_column("_change_type", pa.array([change_type] * rows.num_rows, pa.string()))
    with open(os.path.join(root, name), "wb") as fh:
        pq.write_table(rows, fh, compression="snappy")
        fh.flush()
        fsync(fh.fileno())
    fsync_path(directory)
    if created:
        fsync_path(root)
    return {"cdc": {"path": name, "partitionValues": {}, "size": os.path.getsize(os.path.join(root, name)),
                    "dataChange": False}}


def delete_rows(table: DeltaTable, guids: list[bytes], seqs: tuple[int, int] | None = None) -> int | None:
    """Delete the rows whose `guid` is one of `guids` from a local table
    whose appends `LocalLog` writes (the primary's PUT and confirm logs),
    committing through a `LocalLog` of its own; return how many went, or
    None for a table it must not write (an object store, a protocol
    `local_log_refusal` names): the caller deletes through delta-rs then.

    delta-rs's MERGE lost every commit race to a primary appending every
    few milliseconds (100 retries in a row, each rebuilding its snapshot).
    Here a lost race costs a `link` and reading the winner's small JSON,
    and appends never conflict with a delete: only a commit that removed
    one of the files rewritten here does (a compaction), and then the
    delete is planned again from a new snapshot, up to `DELETE_ATTEMPTS`
    times. `seqs` (the lowest and highest seq of the rows) skips the files
    whose statistics rule them out.

    Each file holding such rows is rewritten without them (dataChange=true,
    its compaction level kept in its name), and the deleted rows go to a
    change data file, as Delta's DELETE writes them: a change-feed reader
    (a federation link) sees deletes at that version, not the kept rows
    again as inserts. The dedup stream skips the commit
    (`skipChangeCommits`)."""
    root = local_root(table.table_uri)
    if root is None or local_log_refusal(table) is not None:
        return None
    wanted = pa.array(guids, pa.binary())
    failure: Exception | None = None
    for _ in range(DELETE_ATTEMPTS):
        table.update_incremental()
        try:
            return _delete_once(table, root, wanted, seqs)
        except CommitFailedError as exc:   # a file it rewrote was removed first (a compaction): plan again
            failure = exc
    raise CommitFailedError(f"{root}: the delete lost {DELETE_ATTEMPTS} times to commits that removed its files; "
                            f"the last: {failure}")


def _delete_once(table: DeltaTable, root: str, wanted: pa.Array, seqs: tuple[int, int] | None) -> int:
    read_version = table.version()
    files = pa.table(table.get_add_actions(flatten=True))
    if files.num_rows == 0:
        return 0
    candidates = files
    if seqs is not None and "min.seq" in files.column_names and not files["min.seq"].null_count:
        overlaps = pc.and_(pc.less_equal(files["min.seq"], seqs[1]), pc.greater_equal(files["max.seq"], seqs[0]))
        candidates = files.filter(overlaps)
    schema = pa.schema(table.schema().to_arrow())
    now_ms = int(time.time() * 1000)
    actions: list[dict[str, Any]] = []
    removes: set[str] = set()
    gone: list[pa.Table] = []
    for path, size in zip(candidates["path"].to_pylist(), candidates["size_bytes"].to_pylist()):
        hit = pc.is_in(pq.read_table(f"{root}/{path}", columns=["guid"], use_threads=False)["guid"], wanted)
        if not pc.any(hit).as_py():
            continue
        rows = read_data_file(root, path, schema)     # the same file: its rows in the same order as `hit`
        kept = rows.filter(pc.invert(hit))
        if kept.num_rows:
            named = _DATA_FILE_NAME.match(os.path.basename(path))
            add = write_data_file_from(root, schema, [kept], named.group(1) if named else "part-00000")
            actions.append(add_action_json(add))
        actions.append(remove_action_json(path, size, now_ms, data_change=True))
        removes.add(path)
        gone.append(rows.filter(hit))
    if not removes:
        return 0
    deleted = pa.concat_tables(gone)
    actions.append(_write_change_data(root, deleted, "delete"))
    # What the log knows must be the latest version as of now, not as of the
    # snapshot: the files written above may have taken longer than the log
    # keeps its entries (trimming), and a put-if-absent into a trimmed gap
    # would commit below a checkpoint. The versions since the snapshot are
    # checked for removes of these files.
    log = LocalLog(root, read_version, durable=True, fence=None)
    table.update_incremental()
    log.learn(table.version())
    log.commit_actions({"operation": "DELETE", "operationParameters": {"predicate": "guid IN (...)"},
                        "isBlindAppend": False,   # Spark's metrics are strings
                        "operationMetrics": {"numDeletedRows": str(deleted.num_rows),
                                             "numRemovedFiles": str(len(removes))}},
                       actions, removes=frozenset(removes), read_version=read_version)
    return int(deleted.num_rows)


def write_checkpoint(table: DeltaTable, sync_root: str | None) -> int:
    """Checkpoint `table` at its handle's version, durably on a local disk
    (`sync_root`); return that version."""
    table.create_checkpoint()
    version = table.version()
    if sync_root is not None:
        sync_log(sync_root, version)
    return version


# The fewest seconds between two checkpoints a `Checkpointer` writes. Small
# commits come fast (a per-message producer at 10k msg/s makes about 90
# commits of about 120 rows a second), and a checkpoint every 10 of them
# was a quarter of the commit path's CPU (`taproot_ops.bench.commits --rows
# 120`: 5.7-6.0 ms a commit, 4.4-4.7 with this bound). A reader opening the
# table replays at most this long's commits after the newest checkpoint.
CHECKPOINT_MIN_INTERVAL_S = 1.0


class Checkpointer:
    """Writes a table's checkpoints on a thread of its own, through a delta-rs
    handle of its own: for a `LocalLog`'s appender, whose commit thread then
    never waits for one (a checkpoint of the PUT log took 25-85 ms here,
    `taproot_ops.bench.commits`). A checkpoint is derived from the log, so a
    late or a failed one costs readers only a longer replay; the next
    request tries again. Requests are taken at most once every
    `min_interval_s`: one that comes sooner is written when that time is up,
    at the table's latest version then, and the requests in between fold
    into it."""

    def __init__(self, path: str, sync_root: str | None, name: str, min_interval_s: float | None = None):
        self.path = path
        self.sync_root = sync_root
        self.min_interval_s = CHECKPOINT_MIN_INTERVAL_S if min_interval_s is None else min_interval_s
        self.checkpoints = 0
        self._handle: DeltaTable | None = None
        self._last = float("-inf")     # time.monotonic() of the last checkpoint's start
        self._thread = WakeThread(f"checkpoint-{name}", self._checkpoint)

    def request(self) -> None:
        self._thread.start()
        self._thread.wake()

    def stop(self) -> None:
        self._thread.stop()

    def checkpoint_now(self) -> int:
        """Checkpoint the table's latest version; return that version."""
        if self._handle is None:
            self._handle = DeltaTable(self.path)
        else:
            self._handle.update_incremental()
        version = write_checkpoint(self._handle, self.sync_root)
        self.checkpoints += 1
        return version

    def _checkpoint(self) -> None:
        if not self._thread.pause(self._last + self.min_interval_s - time.monotonic()):
            return     # stopping: the next open's replay is a little longer, nothing is lost
        self._last = time.monotonic()
        try:
            self.checkpoint_now()
        except Exception:
            log.warning("%s: checkpoint failed; the next one is tried after more commits", self.path,
                        exc_info=True)


class Appender:
    """Blind appends to one table. With `epoch`, the table is claimed for that
    primary epoch first and every commit carries it
    (`storage.leases.FencedAppender`): a stale primary's append raises `Fenced`.
    `durable` (default): on a local table, `append` returns only once the
    commit is on stable storage (the module's docstring).

    A local table's commits are written by a `LocalLog`; delta-rs's handle
    then moves only when `table` is read, or when the log has not seen the
    latest version for a while (`LOCAL_LOG_FRESH_S`). A checkpoint is written
    every `delta.checkpointInterval` commits, in `settle`, or by a
    `Checkpointer` thread with `background_checkpoints` (the primary's
    tables). On an object store (or a table whose protocol `LocalLog` does
    not write) delta-rs commits, through the one handle. After a commit is
    answered, `reserve` has a thread make the next one's files (`_reserved`)."""

    def __init__(self, path: str, schema: pa.Schema, storage_options: dict[str, str] | None = None,
                 epoch: int | None = None, durable: bool = True, checkpoints: bool = True,
                 background_checkpoints: bool = False):
        self.path = path
        self.schema = schema
        # A checkpoint every `delta.checkpointInterval` commits; False only to
        # measure the alternative (bench.commits).
        self.checkpoints = checkpoints
        self._handle = open_or_create(path, schema, storage_options)
        self.durable = durable
        # The commits are fsynced on a local disk with `durable` (an object
        # store's PUT is durable when it is answered).
        self.sync_root = local_root(path) if durable else None
        self.fence = None if epoch is None else FencedAppender(self._handle, epoch, schema)
        self._unsettled = False   # the handle is behind a commit it must settle
        if self.fence is not None:
            self.fence.fence()
            if self.sync_root is not None:
                sync_log(self.sync_root, self._handle.version())
        # The version up to which the handle's snapshot holds no other
        # primary's claim: its own claim, then each of its own commits.
        self._checked_version: int | None = self._handle.version() if self.fence is not None else None
        root = local_root(path)
        refusal = local_log_refusal(self._handle) if root is not None else "not a local table"
        self.log: LocalLog | None = None
        if refusal is None:
            assert root is not None
            LocalLog.remove_leftovers(root)
            self.log = LocalLog(root, self._handle.version(), durable, self.fence)
        elif root is not None:
            log.warning("%s: %s; its commits go through delta-rs", path, refusal)
        self.checkpoint_interval = int(self._handle.metadata().configuration.get("delta.checkpointInterval", "100"))
        self._checkpointed = self._handle.version()
        # With `background_checkpoints`, a local log's checkpoints are written
        # by a thread (`Checkpointer`); else in `settle`.
        self.checkpointer = Checkpointer(path, self.sync_root, os.path.basename(path.rstrip("/"))) \
            if self.log is not None and checkpoints and background_checkpoints else None
        # The next commit's data file and temp file, made by the `reserve`
        # thread after a commit (the module's `reserve_data_file`), and when.
        self._reserved: tuple[str, str, float] | None = None
        self._reserved_lock = threading.Lock()
        self._reserver: WakeThread | None = None
        self._closed = False

    @property
    def commit_lock(self) -> threading.Lock | None:
        """What another writer of this process holds while it commits to the
        table through delta-rs (`LocalLog.lock`); None without a local log."""
        return self.log.lock if self.log is not None else None

    def close(self) -> None:
        """Stop the checkpoint thread, if any, and remove the reserved files
        (the appender is not used after)."""
        if self.checkpointer is not None:
            self.checkpointer.stop()
        with self._reserved_lock:
            self._closed = True
            reserved, self._reserved = self._reserved, None
        if self._reserver is not None:
            self._reserver.stop()
        if reserved is not None:
            self._unlink_reserved(reserved)

    def reserve(self) -> None:
        """Have the next commit's data file and commit temp file made, empty,
        by a thread of the appender's own (a local log's table only): a
        file's creation can cost a millisecond (`reserve_data_file`), twice
        a commit, and the commit thread then takes files already made
        instead. Called after a commit is answered; it never waits. A
        failure leaves nothing reserved: the commit creates its files itself."""
        if self.log is None:
            return
        if self._reserver is None:
            self._reserver = WakeThread(f"reserve-{os.path.basename(self.path.rstrip('/'))}", self._make_reserved)
            self._reserver.start()
        self._reserver.wake()

    def _make_reserved(self) -> None:
        assert self.log is not None
        with self._reserved_lock:
            if self._reserved is not None or self._closed:
                return
        data = None
        try:
            data = reserve_data_file(self.log.root, durable=self.durable)
            made: tuple[str, str, float] | None = (data, self.log.reserve_temp(), time.monotonic())
        except OSError:
            log.warning("%s: reserving the next commit's files failed; it creates them itself", self.path,
                        exc_info=True)
            if data is not None:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.log.root, data))
            return
        with self._reserved_lock:
            if self._reserved is None and not self._closed:
                self._reserved, made = made, None
        if made is not None:     # closed meanwhile
            self._unlink_reserved(made)

    def _unlink_reserved(self, reserved: tuple[str, str, float]) -> None:
        assert self.log is not None
        for path in (os.path.join(self.log.root, reserved[0]), reserved[1]):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _take_reserved(self) -> tuple[str | None, str | None]:
        """The reserved data file's name and temp file, if any and young: a
        data file reserved longer ago than `RESERVED_MAX_AGE_S` is left to
        vacuum as a stray (which removes strays of an hour and more) and a
        new one made, so vacuum can never take a file while it is written."""
        with self._reserved_lock:
            reserved, self._reserved = self._reserved, None
        if reserved is None:
            return None, None
        if time.monotonic() - reserved[2] > RESERVED_MAX_AGE_S:
            self._unlink_reserved(reserved)
            return None, None
        return reserved[0], reserved[1]

    @property
    def table(self) -> DeltaTable:
        """The delta-rs handle, at the latest version this appender committed."""
        if self.log is not None and self._handle.version() < self.log.version:
            self._update()
        return self._handle

    def _update(self) -> None:
        """The handle to the table's latest version; with a local log, what it
        may write checked again (a claim or a protocol change since)."""
        self._handle.update_incremental()
        if self.log is None:
            return
        if self.fence is not None:
            self.fence.check()
        refusal = local_log_refusal(self._handle)
        if refusal is not None:
            log.warning("%s: %s now; its commits go through delta-rs from here", self.path, refusal)
            self.log = None
            return
        self.log.learn(self._handle.version())

    def settle(self) -> None:
        """After an `append(settle=False)`: move the handle to the table's
        latest version (delta-rs commits), or write the checkpoint that is
        due (a local log); a no-op otherwise."""
        if not self._unsettled:
            return
        self._update()
        if self.log is not None:
            if self.checkpoints:
                write_checkpoint(self._handle, self.sync_root)
            self._checkpointed = self._handle.version()
        self._unsettled = False

    def append(self, batch: pa.Table, settle: bool = True) -> int:
        """Commit `batch` as one Delta version and return that version.
        `settle=False`: return as soon as the commit is durable, and leave
        the handle's move or the checkpoint to `settle()` (or the next
        `append`).

        Another writer of the same engine (retention's delete, compaction) may
        commit in between: a blind append conflicts with neither, so the
        append is committed at a later version, keeping its data file,
        unless that commit shows a newer primary epoch (`Fenced`)."""
        self.settle()
        # The cast is a compute call per column (each gives the GIL up): only when needed.
        rows = batch if batch.schema.equals(self.schema) else batch.cast(self.schema)
        name, temp = self._take_reserved()
        # A reserved file's directory entry was made durable with it.
        add = write_data_file(self.path, rows, durable=self.durable, name=name, entry_durable=name is not None)
        for attempt in range(APPEND_ATTEMPTS):
            if self.log is not None and not self.log.fresh():
                self._update()
            local = self.log
            try:
                if local is not None:
                    reserved, temp = temp, None   # consumed by this attempt, committed or not
                    version = local.commit([add], reserved)
                    if self._checkpoint_due(version):
                        if self.checkpointer is not None:
                            self.checkpointer.request()
                            self._checkpointed = version
                        else:
                            self._unsettled = True
                            if settle:
                                self.settle()
                    return version
                return self._commit_delta_rs(add, settle)
            except (CommitFailedError, LogChanged):
                if attempt == APPEND_ATTEMPTS - 1:
                    raise
                self._update()
                if self.fence is not None:
                    self.fence.check()
        raise AssertionError("unreachable")

    def _checkpoint_due(self, version: int) -> bool:
        """delta-rs's rule: a checkpoint at every version v with (v + 1) a
        multiple of the interval, or the first after it when another writer
        committed that one."""
        interval = self.checkpoint_interval
        return (version + 1) // interval > (self._checkpointed + 1) // interval

    def _commit_delta_rs(self, add: AddAction, settle: bool) -> int:
        commit_properties = None
        if self.fence is not None:
            # A newer primary's claim is a commit of its own: when the handle
            # holds none since the last check (its version is this appender's
            # last commit), there is nothing to check (0.5 ms idle, several
            # under load). A claim that lands after the handle's version
            # makes this commit conflict (the same app id): the retry checks.
            if self._handle.version() != self._checked_version:
                self.fence.check()
            commit_properties = self.fence.commit_properties()
        hooks = PostCommitHookProperties(create_checkpoint=self.checkpoints, cleanup_expired_logs=False)
        version = commit_files(self._handle, [add], self.schema, commit_properties, hooks, self.sync_root,
                               settle=settle)
        self._unsettled = self._handle.version() != version
        self._checked_version = version
        return version


def read_since(table: DeltaTable, after_version: int, columns: list[str] | None = None
               ) -> tuple[int, pa.Table]:
    """Return (latest version, rows inserted by versions after `after_version`).

    Uses the change feed (inserts are synthesised from add actions, so it works
    without `delta.enableChangeDataFeed`); only inserts are returned, with their
    `_commit_version`. When the commit after `after_version` is not there,
    nothing changed: one stat (`has_commit`), not a refresh, which lists the
    whole log (2 ms at 500 entries, 12 at 10,000).
    """
    if not has_commit(table.table_uri, after_version + 1):
        return table.version(), pa.table({})
    return _change_feed_since(table, after_version, columns)


def _change_feed_since(table: DeltaTable, after_version: int, columns: list[str] | None) -> tuple[int, pa.Table]:
    """`read_since` once a commit after `after_version` is known to exist:
    the handle refreshed, and the inserts from delta-rs's change feed."""
    table.update_incremental()
    latest = table.version()
    if latest <= after_version:
        return latest, pa.table({})
    # A table written by an older release may lack a column: read what exists
    # and return the rest as nulls (the writer adds them when it next starts).
    present = set(table.schema().to_arrow().names)
    missing = [] if columns is None else [c for c in columns if c not in present]
    cdf_columns = None if columns is None else [*(c for c in columns if c in present),
                                                "_change_type", "_commit_version"]
    reader = table.load_cdf(starting_version=after_version + 1, ending_version=latest, columns=cdf_columns)
    rows = without_views(pa.RecordBatchReader.from_stream(reader).read_all())
    rows = rows.filter(pc.equal(rows["_change_type"], "insert"))
    keep = [c for c in rows.column_names if c not in ("_change_type", "_commit_timestamp")]
    rows = rows.select(keep)
    for name in missing:
        rows = rows.append_column(name, pa.nulls(rows.num_rows))
    return latest, rows


# The actions a version may hold that neither add rows nor change how they
# are read: a version of only these and `add`/`remove` is read straight from
# its commit file by `LogTail` (anything else, `cdc` and `metaData` first, goes
# through delta-rs's change feed).
_PLAIN_ACTIONS = frozenset({"commitInfo", "txn", "domainMetadata"})


class LogTail:
    """A reader of the rows each new version of a table inserts, version
    after version (the primary's tail of the delivery log): `read_since`
    returns what `read_since(table, ...)` does.

    On a local disk it reads the new versions' commit files itself and the
    Parquet files they add, as long as every one of those versions is a
    plain append (add actions with `dataChange`, no deletion vector, no
    partition values; removes and data-unchanged rewrites such as OPTIMIZE's
    add no rows). delta-rs's refresh and change feed list the whole
    `_delta_log/` and plan a query each time: 10 ms of CPU for one new
    commit with 500 entries in the log, 43 ms with 10,000
    (`docs/benchmarks.md`), where this reads one file and its data. A version
    it does not read itself (change data files, a schema change, anything
    else) goes through delta-rs, whose refresh moves the handle on from
    where it was, from the newest checkpoint if the log behind has been
    trimmed since. On an object store, delta-rs does every read."""

    def __init__(self, table: DeltaTable):
        self.table = table
        self.root = local_root(table.table_uri)
        self.read_directly = 0     # versions read from their commit files
        self.read_by_delta_rs = 0  # versions read through delta-rs's change feed

    def read_since(self, after_version: int, columns: list[str] | None = None) -> tuple[int, pa.Table]:
        uri = self.table.table_uri
        if not has_commit(uri, after_version + 1):
            return after_version, pa.table({})   # nothing new: one stat
        if self.root is not None and columns is not None:
            found = self._appended_since(after_version, columns)
            if found is not None:
                return found
        latest, rows = _change_feed_since(self.table, after_version, columns)
        self.read_by_delta_rs += max(0, latest - after_version)
        return latest, rows

    def _appended_since(self, after_version: int, columns: list[str]) -> tuple[int, pa.Table] | None:
        """(latest version, rows its versions after `after_version` added),
        or None if one of them is not a plain append."""
        assert self.root is not None
        files: list[tuple[int, str]] = []
        version = after_version
        while True:
            try:
                entry = _local_log_entry(self.root, version + 1)
            except FileNotFoundError:
                break
            for line in entry.splitlines():
                if not line.strip():
                    continue
                try:
                    action = json.loads(line)
                except ValueError:
                    return None   # not a commit this reader knows: delta-rs says what it is
                if not isinstance(action, dict) or len(action) != 1:
                    return None
                (kind, body), = action.items()
                if not isinstance(body, dict):
                    return None
                if kind == "add":
                    if not body.get("dataChange", True):
                        continue   # a rewrite of rows already there (OPTIMIZE, a compaction)
                    path = body.get("path")
                    if (not isinstance(path, str) or body.get("deletionVector") or body.get("partitionValues")
                            or "://" in path):
                        return None
                    files.append((version + 1, urllib.parse.unquote(path)))
                elif kind != "remove" and kind not in _PLAIN_ACTIONS:
                    return None
            version += 1
        # The table's schema as of this reader's handle, which no version
        # read here can have changed (a metaData action goes to delta-rs).
        table_schema = pa.schema(self.table.schema().to_arrow())
        fields = {f.name: f.with_type(_plain_type(f.type)) for f in table_schema}
        schema = pa.schema([fields[c] for c in columns if c in fields])
        parts = []
        for v, path in files:
            rows = read_data_file(self.root, path, schema)
            parts.append(rows.append_column("_commit_version", pa.repeat(pa.scalar(v, pa.uint64()), rows.num_rows)))
        rows = pa.concat_tables(parts) if parts else pa.schema(
            [*schema, pa.field("_commit_version", pa.uint64())]).empty_table()
        for name in columns:
            if name not in fields:
                rows = rows.append_column(name, pa.nulls(rows.num_rows))
        self.read_directly += version - after_version
        return version, rows


def read_snapshot(table: DeltaTable, columns: list[str]) -> tuple[int, pa.Table]:
    """(version, every row of the latest version). Unlike replaying the change
    feed from version 0, this needs only the files the snapshot references, so
    it works after retention has vacuumed older ones."""
    table.update_incremental()
    present = set(table.schema().to_arrow().names)
    rows = without_views(table.to_pyarrow_table(columns=[c for c in columns if c in present]))
    for name in columns:
        if name not in present:
            rows = rows.append_column(name, pa.nulls(rows.num_rows))
    return table.version(), rows


def _plain_type(t: pa.DataType) -> pa.DataType:
    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), _plain_type(t.item_type))
    return t


def without_views(table: pa.Table) -> pa.Table:
    """delta-rs's change feed returns string_view/binary_view columns, which many
    pyarrow kernels (take, filter) do not handle yet: cast to the plain types."""
    schema = pa.schema([f.with_type(_plain_type(f.type)) for f in table.schema])
    return table if schema == table.schema else table.cast(schema)
