"""The primary's own commits to its local tables (`storage.deltars.LocalLog`):
what it writes is read back by delta-rs, its change feed and the trimmer as
delta-rs's own commits are; other writers' commits are stepped over, a newer
primary's claim fences, and a table it cannot write goes through delta-rs."""

import glob
import json
import os
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from storage import deltars, tables
from storage.leases import Fenced

SCHEMA = pa.schema([pa.field("x", pa.int64())])


def rows(*values: int) -> pa.Table:
    return pa.table({"x": list(values)}, schema=SCHEMA)


def xs(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table()["x"].to_pylist())


def checkpoint_versions(path: str) -> list[int]:
    return sorted(int(os.path.basename(p)[:20])
                  for p in glob.glob(os.path.join(path, "_delta_log", "*.checkpoint.parquet")))


def actions(path: str, version: int) -> list[dict]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_its_commits_are_delta_rs_readable_with_their_epoch_stats_and_change_feed(tmp_path):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA, epoch=3)     # 0 creates, 1 claims
    assert appender.log is not None
    assert [appender.append(rows(i, i + 100)) for i in range(3)] == [2, 3, 4]
    assert xs(path) == [0, 1, 2, 100, 101, 102]
    table = DeltaTable(path)
    assert table.transaction_version("taproot-primary") == 3
    assert table.to_pyarrow_table(filters=[("x", ">=", 101)]).num_rows == 2   # pruned by the add's stats
    commit = actions(path, 4)
    assert commit[0]["commitInfo"]["operation"] == "WRITE" and commit[0]["commitInfo"]["isBlindAppend"]
    assert json.loads(commit[1]["add"]["stats"]) == {"numRecords": 2, "minValues": {"x": 2}, "maxValues": {"x": 102},
                                                     "nullCount": {"x": 0}}
    assert commit[2] == {"txn": {"appId": "taproot-primary", "version": 3}}
    latest, since = deltars.read_since(table, 2, columns=["x"])
    assert latest == 4 and sorted(since["x"].to_pylist()) == [1, 2, 101, 102]
    assert sorted(since["_commit_version"].to_pylist()) == [3, 3, 4, 4]


def test_the_handle_moves_only_for_a_checkpoint_or_a_reader(tmp_path, monkeypatch):
    """delta-rs's update is what a commit cost: the local log needs none, but
    a checkpoint is written every `delta.checkpointInterval` (10) commits at
    delta-rs's versions (9, 19, ...), and `table` brings the handle up."""
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    updates = []
    real = appender._handle.update_incremental
    monkeypatch.setattr(appender._handle, "update_incremental", lambda: (updates.append(1), real())[1])
    for i in range(8):
        appender.append(rows(i), settle=False)
    assert updates == [] and appender._handle.version() == 0
    assert appender.append(rows(8), settle=False) == 9
    assert not os.path.exists(os.path.join(path, "_delta_log", f"{9:020d}.checkpoint.parquet"))
    appender.settle()                          # the ACKs went first; now the checkpoint
    assert updates == [1] and os.path.exists(os.path.join(path, "_delta_log", f"{9:020d}.checkpoint.parquet"))
    appender.settle()
    assert updates == [1]
    appender.append(rows(9))
    assert appender.table.version() == 10 and updates == [1, 1]
    assert appender.table.to_pyarrow_table().num_rows == 10 and updates == [1, 1]


def test_another_writers_commit_is_stepped_over_and_a_newer_claim_fences(tmp_path):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA, epoch=1)
    appender.append(rows(1))                                           # version 2
    write_deltalake(path, rows(2), mode="append")                      # 3: compaction, say
    write_deltalake(path, rows(3), mode="append")                      # 4
    assert appender.append(rows(4)) == 5
    assert xs(path) == [1, 2, 3, 4]
    deltars.Appender(path, SCHEMA, epoch=2)                            # 6: a newer primary claims it
    with pytest.raises(Fenced):
        appender.append(rows(99))
    assert xs(path) == [1, 2, 3, 4] and DeltaTable(path).version() == 6
    assert not glob.glob(os.path.join(path, "_delta_log", ".taproot-*"))


def test_a_metadata_change_is_checked_again_and_a_table_it_cannot_write_goes_through_delta_rs(tmp_path):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    appender.append(rows(1))
    other = DeltaTable(path)
    other.alter.set_table_properties({"delta.logRetentionDuration": "interval 2 days"})   # a metaData action
    assert appender.append(rows(2)) == 3 and appender.log is not None
    other.update_incremental()
    other.alter.add_constraint({"small": "x < 1000"})     # a check constraint: not a blind append's to judge
    assert appender.append(rows(3)) == 5
    assert appender.log is None                           # delta-rs's commits from here on
    assert actions(path, 5)[0]["commitInfo"]["clientVersion"].startswith("delta-rs")
    assert appender.append(rows(4)) == 6
    assert xs(path) == [1, 2, 3, 4]


def test_a_log_unsure_of_the_latest_version_asks_delta_rs_and_never_commits_into_a_trimmed_gap(tmp_path, monkeypatch):
    """Trimming deletes log entries below a checkpoint once they are older
    than the retention (5 s at the least). A put-if-absent aimed at such a
    deleted version would succeed, below the checkpoint readers start from:
    an append lost. So a log whose knowledge is older than 1 s asks delta-rs
    for the latest version first."""
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    appender.append(rows(0))                                           # version 1
    other = deltars.Appender(path, SCHEMA)
    for i in range(1, 25):
        other.append(rows(i))                                          # 2..25, checkpoints 9 and 19
    assert deltars.trim_log(path, needed_from=25, min_age_s=0) > 0
    assert not os.path.exists(os.path.join(path, "_delta_log", f"{2:020d}.json"))
    monkeypatch.setattr(appender.log, "known_at", appender.log.known_at - deltars.LOCAL_LOG_FRESH_S)
    assert appender.append(rows(25)) == 26
    assert xs(path) == list(range(26))


def test_a_writer_killed_before_its_link_leaves_nothing_a_reader_sees(tmp_path):
    path = str(tmp_path / "puts")
    deltars.Appender(path, SCHEMA).append(rows(1))
    leftover = os.path.join(path, "_delta_log", ".taproot-deadbeef.json.tmp")
    with open(leftover, "w") as fh:
        fh.write('{"add": {"path": "never-written.parquet"}}\n')
    assert xs(path) == [1]                                # readers do not list it
    appender = deltars.Appender(path, SCHEMA)
    assert not os.path.exists(leftover)
    appender.append(rows(2))
    assert xs(path) == [1, 2]


def test_the_primary_tables_are_written_by_the_local_log_and_spark_reads_them_back(tmp_path):
    """The tables the primary makes (PUT log schema and properties) are ones
    the local log writes; Spark's reading of them is the pipeline's suites'."""
    appender = deltars.Appender(str(tmp_path / "puts"), tables.PUTS_SCHEMA, epoch=1)
    assert appender.log is not None and deltars.local_log_refusal(appender.table) is None


@pytest.mark.integration   # threads paced by the clock: out of the fast tier
def test_a_background_checkpointer_writes_them_off_the_commit_thread(tmp_path, monkeypatch):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA, background_checkpoints=True)
    updates = []
    real = appender._handle.update_incremental
    monkeypatch.setattr(appender._handle, "update_incremental", lambda: (updates.append(1), real())[1])
    try:
        for i in range(12):
            appender.append(rows(i))
        assert appender.checkpointer is not None
        deadline = time.monotonic() + 30
        while not checkpoint_versions(path):
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.05)
        assert updates == []                       # the commit thread's handle never moved
        assert checkpoint_versions(path)[0] >= 9
    finally:
        appender.close()
    assert xs(path) == list(range(12))


@pytest.mark.integration   # threads paced by the clock: out of the fast tier
def test_checkpoints_requested_faster_than_the_bound_fold_into_one_at_the_latest_version(tmp_path):
    """The first request is written at once; those within `min_interval_s`
    after it wait for it to pass and become one checkpoint, of the version
    the table has then. A stop while one waits writes nothing and returns."""
    path = str(tmp_path / "puts")
    write_deltalake(path, rows(0))
    bound = 3.0                                # wide, so a loaded machine's slow writes stay within it
    checkpointer = deltars.Checkpointer(path, path, "test", min_interval_s=bound)

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 30
        while checkpointer.checkpoints < count:
            assert time.monotonic() < deadline, f"{checkpointer.checkpoints} checkpoints, not {count}"
            time.sleep(0.02)

    try:
        asked = time.monotonic()               # the second checkpoint starts at least `bound` after the first
        checkpointer.request()
        wait_for(1)
        assert checkpoint_versions(path) == [0]
        for i in range(1, 6):                  # five commits, each asking for a checkpoint
            write_deltalake(path, rows(i), mode="append")
            checkpointer.request()
        time.sleep(0.3)
        assert checkpointer.checkpoints == 1   # within the bound: none yet
        wait_for(2)
        assert time.monotonic() - asked >= bound
        time.sleep(0.3)
        assert checkpointer.checkpoints == 2 and checkpoint_versions(path) == [0, 5]
        write_deltalake(path, rows(6), mode="append")
        checkpointer.request()                 # waits out the bound; the stop ends the wait
        time.sleep(0.1)
        stopped = time.monotonic()
        checkpointer.stop()
        assert time.monotonic() - stopped < 0.5 and checkpoint_versions(path) == [0, 5]
    finally:
        checkpointer.stop()
    assert xs(path) == list(range(7))


@pytest.mark.integration   # threads paced by the clock: out of the fast tier
def test_the_compactor_commits_between_back_to_back_appends(tmp_path):
    """delta-rs retries a lost race 15 times; local-log appends back to back
    would win every race. The compactor holds the appender's commit lock."""
    from primary.compaction import Compactor

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA, background_checkpoints=True)
    for i in range(20):
        appender.append(rows(i))
    stop = threading.Event()
    appended: list[int] = []

    def append_on() -> None:
        while not stop.is_set():
            appender.append(rows(1000 + len(appended)), settle=False)
            appended.append(1)

    thread = threading.Thread(target=append_on)
    thread.start()
    try:
        time.sleep(0.2)
        compactor = Compactor(path, 10, "test", appender=appender)
        metrics = compactor.compact_now()
    finally:
        stop.set()
        thread.join()
        appender.close()
    assert metrics["numFilesRemoved"] >= 20 and appended
    assert xs(path) == list(range(20)) + list(range(1000, 1000 + len(appended)))


def test_a_commit_whose_temp_file_a_new_primary_removed_after_the_link_stands(tmp_path, monkeypatch):
    """A new primary opening the table removes temp files it takes for a dead
    writer's. If that one was already linked, the commit stands: the append
    answers its version, not an error (its PUTs would be refused, and sent
    again, though stored)."""
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    log_ = appender.log
    real = log_._link

    def link_then_removed(temp: str, removes: frozenset[str]) -> int:
        version = real(temp, removes)
        deltars.LocalLog.remove_leftovers(path)
        return version

    monkeypatch.setattr(log_, "_link", link_then_removed)
    assert appender.append(rows(7)) == 1
    assert xs(path) == [7]


def reserve(appender: deltars.Appender) -> tuple[str, str, float]:
    """`Appender.reserve`, then its thread's files."""
    appender.reserve()
    deadline = time.monotonic() + 10
    while appender._reserved is None:
        assert time.monotonic() < deadline, "the reserve thread made no files in 10 s"
        time.sleep(0.005)
    return appender._reserved


def test_reserved_files_are_used_once_and_never_when_old_removed_or_closed(tmp_path, monkeypatch):
    """The files `reserve` makes for the next commit: used by it, not by
    the one after; a reservation older than RESERVED_MAX_AGE_S is removed,
    not written (vacuum may take a stray that old); a temp file a new
    primary removed as a leftover is made again; `close` removes them."""
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    log_dir = os.path.join(path, "_delta_log")

    def parquet_files() -> set[str]:
        return {n for n in os.listdir(path) if n.endswith(".parquet")}

    def temps() -> list[str]:
        return glob.glob(os.path.join(log_dir, ".taproot-*"))

    reserve(appender)
    # One reservation at a time: the thread's work, called here so that it
    # has run before the commits below (a wake of the thread could run it
    # after the first commit took the reservation, and reserve again).
    appender._make_reserved()
    assert len(temps()) == 1 and len(parquet_files()) == 1
    (data, _temp, _) = appender._reserved
    assert appender.append(rows(1)) == 1 and actions(path, 1)[1]["add"]["path"] == data
    assert appender.append(rows(2)) == 2 and actions(path, 2)[1]["add"]["path"] != data
    assert not temps() and len(parquet_files()) == 2

    (old, _temp, _) = reserve(appender)
    monkeypatch.setattr(deltars, "RESERVED_MAX_AGE_S", 0.0)
    time.sleep(0.01)
    assert appender.append(rows(3)) == 3
    assert actions(path, 3)[1]["add"]["path"] != old and old not in parquet_files() and not temps()
    monkeypatch.setattr(deltars, "RESERVED_MAX_AGE_S", 60.0)

    reserve(appender)
    deltars.LocalLog.remove_leftovers(path)   # a new primary's open took the reserved temp
    assert not temps()
    assert appender.append(rows(4)) == 4 and not temps()

    (unused, _temp, _) = reserve(appender)
    appender.close()
    assert unused not in parquet_files() and not temps()
    assert xs(path) == [1, 2, 3, 4] and len(parquet_files()) == 4


def test_a_compaction_whose_input_another_writer_removed_first_is_refused(tmp_path):
    """A compaction's commit through the log removes its inputs: if another
    commit removed one of them first (retention, another compaction), it is
    a conflict, as delta-rs judges it; nothing is committed."""
    from deltalake.transaction import RemoveAction

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    for i in range(3):
        appender.append(rows(i))
    first = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pydict()["path"][0]
    other = DeltaTable(path)
    deltars.commit_files(other, [RemoveAction(first, True, 0, size=1)], SCHEMA)     # version 4
    with pytest.raises(Exception, match="removed a file this commit removes"):
        appender.log.commit_actions({"operation": "OPTIMIZE"}, [deltars.remove_action_json(first, 1, 0, False)],
                                    removes=frozenset([first]))
    assert DeltaTable(path).version() == 4
    version = appender.log.commit_actions({"operation": "OPTIMIZE"}, [], removes=frozenset(["not-removed.parquet"]))
    assert version == 5 and len(xs(path)) == 2   # the one removed file is gone, once


def test_a_compaction_is_refused_when_an_input_was_removed_after_its_snapshot_even_if_the_log_stepped_over_it(tmp_path):
    """Retention rewrites a file between the compaction's snapshot and its
    commit, and the appender's commits have moved the log past that: the
    compaction must still see it, or the rows retention deleted come back."""
    from deltalake.transaction import RemoveAction

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, SCHEMA)
    for i in range(3):
        appender.append(rows(i))
    snapshot = DeltaTable(path)                                    # the compaction's, at version 3
    first = pa.table(snapshot.get_add_actions(flatten=True)).to_pydict()["path"][0]
    deltars.commit_files(DeltaTable(path), [RemoveAction(first, True, 0, size=1)], SCHEMA)   # 4: retention
    appender.append(rows(3))                                       # 5: the log steps over 4
    with pytest.raises(Exception, match="removed a file this commit removes"):
        appender.log.commit_actions({"operation": "OPTIMIZE"}, [deltars.remove_action_json(first, 1, 0, False)],
                                    removes=frozenset([first]), read_version=snapshot.version())
    assert DeltaTable(path).version() == 5


@pytest.mark.integration   # threads: out of the fast tier
@pytest.mark.parametrize("which", ["puts", "confirms"])
def test_retention_deletes_from_a_log_the_primary_appends_to_all_the_while(tmp_path, which):
    """delta-rs's MERGE with the GUIDs alone failed whenever an append
    committed while it ran, and bounded by the snapshot's largest seq it
    still lost 100 races in a row to appends every few milliseconds. The
    delete through its own log commits between appends back to back, what
    was appended meanwhile stays, and a change-feed reader sees the deleted
    rows as deletes and nothing as inserted."""
    from datetime import datetime, timedelta, timezone

    from pipelines.retention import delete_guids

    path = str(tmp_path / which)
    schema = tables.PUTS_SCHEMA if which == "puts" else tables.CONFIRMS_SCHEMA
    appender = deltars.Appender(path, schema, epoch=1, background_checkpoints=True)
    start = datetime.now(timezone.utc) - timedelta(hours=1)

    def batch(first: int, n: int) -> pa.Table:
        seqs = list(range(first, first + n))
        if which == "puts":
            from taproot_ops.bench.commits import put_batch
            return put_batch(n, first, 16).set_column(2, "guid", pa.array([s.to_bytes(16, "big") for s in seqs]))
        times = pa.array([start + timedelta(milliseconds=s) for s in seqs], tables.TIMESTAMP)
        return pa.table({"domain": ["d"] * n, "queue": ["q"] * n, "app_id": [""] * n,
                         "guid": [s.to_bytes(16, "big") for s in seqs], "seq": seqs, "confirm_time": times},
                        schema=schema)

    for i in range(10):
        appender.append(batch(i * 10, 10))
    stop = threading.Event()
    appended: list[int] = []

    def append_on() -> None:
        while not stop.is_set():
            appender.append(batch(1000 + 10 * len(appended), 10), settle=False)   # back to back
            appended.append(1)

    thread = threading.Thread(target=append_on)
    thread.start()
    try:
        time.sleep(0.2)
        before = len(appended)
        deleted = delete_guids(DeltaTable(path), [s.to_bytes(16, "big") for s in range(0, 50)], (0, 49))
        during = len(appended) - before
    finally:
        stop.set()
        thread.join()
        appender.close()
    assert deleted == 50 and during > 0
    table = DeltaTable(path)
    seqs = sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist())
    assert seqs == list(range(50, 100)) + list(range(1000, 1000 + 10 * len(appended)))
    [version] = [v for v in range(table.version() + 1)
                 if os.path.exists(os.path.join(path, "_delta_log", f"{v:020d}.json"))
                 and actions(path, v)[0]["commitInfo"].get("operation") == "DELETE"]
    feed = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=version, ending_version=version)).read_all()
    assert feed["_change_type"].to_pylist() == ["delete"] * 50
    assert sorted(feed["seq"].to_pylist()) == list(range(50))


GUIDS = pa.schema([pa.field("guid", pa.binary()), pa.field("seq", pa.int64())])


def guid_rows(*seqs: int) -> pa.Table:
    return pa.table({"guid": [s.to_bytes(16, "big") for s in seqs], "seq": list(seqs)}, schema=GUIDS)


def seqs_of(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist())


def test_a_delete_rewrites_only_the_files_holding_its_rows_and_keeps_their_level(tmp_path, monkeypatch):
    from primary.compaction import file_level

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, GUIDS)
    for i in range(4):
        appender.append(guid_rows(*range(10 * i, 10 * i + 10)))
    read: list[str] = []
    real = deltars.pq.read_table
    monkeypatch.setattr(deltars.pq, "read_table", lambda p, **kw: (read.append(p), real(p, **kw))[1])
    table = DeltaTable(path)
    assert deltars.delete_rows(table, [s.to_bytes(16, "big") for s in (12, 13, 99)], (12, 99)) == 2
    assert len({os.path.basename(p) for p in read}) == 3        # files of seqs 10-39: 0-9 ruled out by stats
    assert seqs_of(path) == [s for s in range(40) if s not in (12, 13)]
    commit = actions(path, DeltaTable(path).version())
    assert commit[0]["commitInfo"]["operation"] == "DELETE"
    assert [a["remove"]["dataChange"] for a in commit if "remove" in a] == [True]
    [add] = [a["add"] for a in commit if "add" in a]
    assert add["dataChange"] and json.loads(add["stats"])["numRecords"] == 8 and file_level(add["path"]) == 0
    assert deltars.delete_rows(DeltaTable(path), [b"x" * 16]) == 0          # nothing matches: no commit
    assert actions(path, DeltaTable(path).version())[0]["commitInfo"]["operation"] == "DELETE"


def test_a_delete_whose_file_a_compaction_removed_first_plans_again(tmp_path, monkeypatch):
    """A compaction commits between the delete's snapshot and its commit,
    removing the file the delete rewrote: the delete must not commit (the
    compaction's output still holds the rows), and the next attempt deletes
    them from that output."""
    from primary.compaction import Compactor, file_level

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, GUIDS)
    for i in range(3):
        appender.append(guid_rows(*range(10 * i, 10 * i + 10)))
    real = deltars.write_data_file_from
    compacted: list[dict] = []

    def write_then_compact(*args, **kwargs):
        added = real(*args, **kwargs)
        if not compacted:
            compacted.append({})     # once: the compaction writes its output through here too
            compacted[0] = Compactor(path, 1, "test", appender=appender).compact_now()
        return added

    attempts: list[int] = []
    once = deltars._delete_once
    monkeypatch.setattr(deltars, "write_data_file_from", write_then_compact)
    monkeypatch.setattr(deltars, "_delete_once", lambda *a: (attempts.append(1), once(*a))[1])
    assert deltars.delete_rows(DeltaTable(path), [(5).to_bytes(16, "big")], (5, 5)) == 1
    assert compacted[0]["numFilesRemoved"] == 3 and len(attempts) == 2
    assert seqs_of(path) == [s for s in range(30) if s != 5]
    [add] = [a["add"] for a in actions(path, DeltaTable(path).version()) if "add" in a]
    assert file_level(add["path"]) == 1             # the compaction's output, rewritten, stays at its level
    assert appender.append(guid_rows(30)) and seqs_of(path)[-1] == 30
