"""Compaction of the primary's tables (delta-rs on a temp dir; no JVM, no sockets)."""

import datetime as dt
import json
import os
import time

import pyarrow as pa
import pytest

from primary import compaction
from primary.compaction import COMPACTION_KEY, LEVEL_FANIN, Compactor, file_level, plan_compaction
from storage import deltars, tables
from tests.conftest import wait_until


def rows(start: int, n: int) -> pa.Table:
    now = dt.datetime.now(dt.timezone.utc)
    return pa.Table.from_pylist([dict(domain="d", queue="q", guid=i.to_bytes(16, "big"), seq=i, payload=b"p",
                                      properties=[], property_types=[], producer_time=now, put_time=now, epoch=1)
                                 for i in range(start, start + n)], schema=tables.PUTS_SCHEMA)


@pytest.mark.parametrize("durable", [True, False], ids=["fsync", "os"])
def test_compactor_bounds_file_count_and_keeps_every_row(tmp_path, durable):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, durable=durable)
    compactor = Compactor(path, every_commits=10, name="test", durable=durable)
    compactor.start()
    try:
        for i in range(25):  # appends go on while compaction runs in the background
            appender.append(rows(i * 4, 4))
            compactor.on_commit()
        wait_until(lambda: compactor.compactions >= 2, 30, what="two background compactions")
    finally:
        compactor.stop()
    table = deltars.try_open(path)
    assert len(table.file_uris()) < 25
    seqs = sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist())
    assert seqs == list(range(100))
    # Compaction commits say dataChange=false, so streaming readers skip them.
    optimize = [h["version"] for h in table.history() if h["operation"] == "OPTIMIZE" or h.get(COMPACTION_KEY)]
    assert optimize
    for version in optimize:
        actions = [json.loads(line) for line in (tmp_path / "puts" / "_delta_log" / f"{version:020d}.json").open()]
        files = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
        assert files and all(f["dataChange"] is False for f in files)


def test_a_durable_compaction_fsyncs_its_files_before_it_commits(tmp_path, monkeypatch):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    for i in range(5):
        appender.append(rows(i * 4, 4))
    before = set(os.listdir(path))
    calls: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    assert Compactor(path, every_commits=1, name="test").compact_now()["numFilesRemoved"] == 5
    written = [f for f in set(os.listdir(path)) - before if f.endswith(".parquet")]
    assert calls == [os.path.join(path, written[0]), path, os.path.join(path, "_delta_log", f"{6:020d}.json"),
                     os.path.join(path, "_delta_log")]
    assert sorted(deltars.try_open(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(20))


def test_the_plan_merges_commit_files_at_once_and_compacted_files_only_by_tens():
    """Level 0 (a commit's own file): any two or more below the target are
    merged. A compacted file (level L) waits until LEVEL_FANIN of its level
    are below the target, so its rows are not read and rewritten at every
    compaction. Files at or above the target are never touched; bins stay
    within it."""
    target = 1000
    commits = {f"part-00000-{i}-c000.snappy.parquet": 100 for i in range(25)}
    assert file_level("part-00000-x-c000.snappy.parquet") == 0
    assert file_level(f"{compaction.LEVEL_PREFIX}3-x-c000.snappy.parquet") == 3
    plan = plan_compaction(commits, target)
    assert [level for level, _ in plan] == [1, 1, 1]
    assert sorted(len(paths) for _, paths in plan) == [5, 10, 10]
    assert sorted(p for _, paths in plan for p in paths) == sorted(commits)

    compacted = {f"{compaction.LEVEL_PREFIX}1-{i}-c000.snappy.parquet": 300 for i in range(LEVEL_FANIN - 1)}
    big = {"part-00000-big-c000.snappy.parquet": target, f"{compaction.LEVEL_PREFIX}1-big-c000.snappy.parquet": 5000}
    assert plan_compaction({**compacted, **big}, target) == []   # one short of the fan-in; the big ones stay
    compacted[f"{compaction.LEVEL_PREFIX}1-last-c000.snappy.parquet"] = 300
    plan = plan_compaction({**compacted, **big}, target)
    assert {level for level, _ in plan} == {2} and all(len(paths) == 3 for _, paths in plan)
    assert not any(p in big for _, paths in plan for p in paths)
    assert plan_compaction({"part-00000-alone-c000.snappy.parquet": 10}, target) == []


def test_a_compaction_streams_its_inputs_and_each_row_is_rewritten_once_per_level(tmp_path, monkeypatch):
    """Rows go through a compaction in chunks (a chunk bound of a few rows
    here), the output is named by its level, and commit files compacted
    again and again are never merged with an earlier output before there are
    LEVEL_FANIN of those."""
    monkeypatch.setattr(compaction, "CHUNK_BYTES", 200)
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    compactor = Compactor(path, every_commits=1, name="test")
    written: list[int] = []
    real = deltars.write_data_file_from

    def counting(root, schema, batches, name_prefix="part-00000", **options):
        if not name_prefix.startswith(compaction.LEVEL_PREFIX):
            return real(root, schema, batches, name_prefix, **options)   # the appender's own commit

        def counted():
            for batch in batches:
                written.append(batch.num_rows)
                yield batch
        return real(root, schema, counted(), name_prefix, **options)
    monkeypatch.setattr(deltars, "write_data_file_from", counting)
    seq = 0
    for _ in range(LEVEL_FANIN):
        for _ in range(3):
            appender.append(rows(seq, 4))
            seq += 4
        compactor.compact_now()
    # Each round merged only its own three commit files (12 rows), in chunks.
    assert sum(written) == 12 * LEVEL_FANIN and max(written) < 12
    files = [os.path.basename(u) for u in deltars.try_open(path).file_uris()]
    assert sorted(file_level(f) for f in files) == [1] * LEVEL_FANIN
    written.clear()
    compactor.compact_now()   # the tenth level-1 file is there: they merge into one level-2 file
    assert sum(written) == 12 * LEVEL_FANIN
    table = deltars.try_open(path)
    assert [file_level(os.path.basename(u)) for u in table.file_uris()] == [2]
    assert sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(seq))
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    assert (stats["num_records"], stats["min.seq"], stats["max.seq"]) == (seq, 0, seq - 1)


def test_tables_from_an_older_release_gain_new_columns(tmp_path):
    """The primary opens a PUT log written before `compression` existed: the
    column is added (old rows read null) and new rows carry it."""
    from deltalake import DeltaTable

    from storage import deltars, tables

    path = str(tmp_path / "puts")
    old_schema = pa.schema([f for f in tables.PUTS_SCHEMA if f.name != "compression"])
    DeltaTable.create(path, old_schema)
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    assert appender.table.schema().to_arrow().names == tables.PUTS_SCHEMA.names
    now = 1_700_000_000_000_000
    appender.append(pa.Table.from_pylist([dict(
        domain="d", queue="q", guid=b"g" * 16, seq=0, payload=b"p", properties=[], property_types=[],
        producer_time=now, put_time=now, epoch=1, compression="zstd")], schema=tables.PUTS_SCHEMA))
    assert DeltaTable(path).to_pyarrow_table(columns=["compression"])["compression"].to_pylist() == ["zstd"]


def log_versions(path: str) -> list[int]:
    return sorted({int(n[:20]) for n in os.listdir(os.path.join(path, "_delta_log")) if n[:20].isdigit()})


def test_trimming_keeps_what_a_reader_resuming_at_a_version_needs(tmp_path):
    """Checkpoints every 10 commits (versions 9, 19, 29 here): a reader that
    needs version 25 on keeps checkpoint 19 and everything after it."""
    from deltalake import DeltaTable

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    for i in range(16):
        appender.append(rows(i * 2, 2))
    stale = DeltaTable(path)   # a handle last refreshed at version 16, as a rarely used reader's
    for i in range(16, 35):
        appender.append(rows(i * 2, 2))
    log_dir = tmp_path / "puts" / "_delta_log"
    assert deltars.trim_log(path, needed_from=25, min_age_s=3600) == 0     # all younger than an hour
    assert deltars.trim_log(path, needed_from=8, min_age_s=0) == 0         # no checkpoint at or below 8
    assert log_versions(path) == list(range(36))

    assert deltars.trim_log(path, needed_from=25, min_age_s=0) == 20       # 19 commits and checkpoint 9
    assert log_versions(path) == list(range(19, 36))
    assert (log_dir / f"{19:020d}.checkpoint.parquet").exists() and (log_dir / "_last_checkpoint").exists()
    fresh = DeltaTable(path)
    assert fresh.version() == 35 and fresh.to_pyarrow_table(columns=["seq"]).num_rows == 70
    stale.update_incremental()
    assert stale.version() == 35 and stale.to_pyarrow_table(columns=["seq"]).num_rows == 70
    # The change feed from version 25 on is whole, as a resuming reader reads it.
    latest, since = deltars.read_since(fresh, 24, columns=["seq"])
    assert latest == 35 and sorted(since["seq"].to_pylist()) == list(range(48, 70))
    appender.append(rows(70, 2))                                           # the writer goes on
    assert DeltaTable(path).to_pyarrow_table(columns=["seq"]).num_rows == 72
    assert deltars.trim_log(path, needed_from=25, min_age_s=0) == 0        # idempotent


def test_the_compactor_trims_the_log_behind_the_reader_and_not_past_it(tmp_path):
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    needed: list[int | None] = [None]
    compactor = Compactor(path, every_commits=0, name="test", log_retention_s=0, log_needed_from=lambda: needed[0])
    assert compactor.every_commits == 100 and not compactor.compact
    for i in range(40):
        appender.append(rows(i, 1))
    assert compactor.trim_log_now() == 0 and log_versions(path) == list(range(41))   # reader unknown: keep all
    needed[0] = 31
    assert compactor.trim_log_now() > 0 and log_versions(path)[0] == 29
    assert compactor.trimmed_log_files == 31   # commits 0-28, checkpoints 9 and 19
    # No reader (the confirm log): the newest checkpoint, 39, bounds it.
    without_reader = Compactor(path, every_commits=0, name="test", log_retention_s=0)
    assert without_reader.trim_log_now() == 11 and log_versions(path) == [39, 40]
    assert Compactor(path, every_commits=0, name="test").trim_log_now() == 0           # trimming off


@pytest.mark.integration
def test_trimming_while_the_writer_commits_and_a_reader_refreshes_fails_neither(tmp_path):
    """The trim deletes log entries while delta-rs lists the same directory
    (the writer's commit, another handle's refresh), with no reader bound.
    The grace (`min_age_s`, the node's `log_retention_s`) is what keeps the
    reader whole: it reads the commit files it has just listed, and without
    a grace a trim can delete one in between (seen: "File not found:
    .../00000000000000000168.json" in a refresh)."""
    import threading

    from deltalake import DeltaTable

    GRACE_S = 2.0
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, epoch=1)
    stop = threading.Event()
    trimmed, refreshed, errors = [0], [0], []

    def trim() -> None:
        while not stop.is_set():
            try:
                trimmed[0] += deltars.trim_log(path, 1 << 62, min_age_s=GRACE_S)
            except Exception as exc:   # noqa: BLE001  (counted: the assertion below reports it)
                errors.append(exc)

    def refresh() -> None:
        reader = DeltaTable(path)
        while not stop.is_set():
            try:
                reader.update_incremental()
                refreshed[0] += 1
            except Exception as exc:   # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=trim), threading.Thread(target=refresh)]
    for thread in threads:
        thread.start()
    try:
        appended, deadline = 0, time.monotonic() + 3 * GRACE_S
        while time.monotonic() < deadline:
            appender.append(rows(appended, 2))
            appended += 2
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors[:3]
    assert trimmed[0] > 10 and refreshed[0] > 10   # files older than the grace went while both ran
    assert sorted(DeltaTable(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(appended))


def test_a_large_merge_rests_between_its_chunks(tmp_path, monkeypatch):
    """Paced: after each chunk it sleeps REST_RATIO times as long as the chunk
    took, so a level-2 merge does not take the cores from the commits at once."""
    monkeypatch.setattr(compaction, "CHUNK_BYTES", 200)
    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    for i in range(6):
        appender.append(rows(i * 4, 4))
    rests: list[float] = []
    # Its own hook, not time.sleep: other threads of this process (a cluster's,
    # an earlier test's) sleep too, and would spin and fill the list.
    monkeypatch.setattr(compaction, "_rest", rests.append)
    assert Compactor(path, every_commits=1, name="test").compact_now()["numFilesRemoved"] == 6
    assert len(rests) >= 2 and all(r > 0 for r in rests)
    rests.clear()
    for i in range(6, 12):
        appender.append(rows(i * 4, 4))
    compaction.compact_durably(deltars.try_open(path), path, 16 << 20, rest_ratio=0)
    assert rests == []


def checkpoint_removes(path: str) -> int:
    import glob

    import pyarrow.parquet as pq
    newest = sorted(glob.glob(os.path.join(path, "_delta_log", "*.checkpoint.parquet")))[-1]
    return len(pq.read_table(newest, columns=["remove"])["remove"].drop_null())


def test_checkpoints_drop_the_tombstones_of_compacted_files_once_their_retention_passes(tmp_path):
    """Every commit file is removed once by compaction, and each checkpoint
    carries every unexpired tombstone: with Delta's week the checkpoint (one
    per 10 commits) grows by a row per commit. The primary's tables keep
    them for PRIMARY_TABLE_PROPERTIES' retention; it is set on a table an
    older release made, too."""
    from deltalake import DeltaTable

    path = str(tmp_path / "puts")
    DeltaTable.create(path, tables.PUTS_SCHEMA, configuration=tables.TABLE_PROPERTIES)   # an older release's
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    retention = tables.PRIMARY_TABLE_PROPERTIES["delta.deletedFileRetentionDuration"]
    assert appender.table.metadata().configuration["delta.deletedFileRetentionDuration"] == retention
    compactor = Compactor(path, every_commits=1, name="test")
    for i in range(12):
        appender.append(rows(i * 4, 4))
    compactor.compact_now()
    while appender.table.version() % 10 != 9:   # up to the commit that writes the next checkpoint
        appender.append(rows(1000 + appender.table.version(), 1))
    assert checkpoint_removes(path) == 12       # still within the retention

    appender.table.alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 300 milliseconds"})
    time.sleep(0.5)
    appender.append(rows(2000, 1))
    while appender.table.version() % 10 != 9:
        appender.append(rows(2000 + appender.table.version(), 1))
    assert checkpoint_removes(path) == 0
    assert sorted(deltars.try_open(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist())[:48] == list(range(48))


def test_maintenance_vacuum_deletes_compacted_files_whose_tombstones_expired_and_keeps_young_strays(tmp_path):
    """The PUT log keeps tombstones minutes, maintenance vacuums hours later:
    delta-rs's default vacuum, which goes by tombstones, would leave every
    compacted commit file on disk for good."""
    from pipelines.retention import vacuum_delta_rs_table

    path = str(tmp_path / "puts")
    appender = deltars.Appender(path, tables.PUTS_SCHEMA)
    appender.table.alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 300 milliseconds"})
    for i in range(12):
        appender.append(rows(i * 4, 4))
    assert Compactor(path, every_commits=1, name="test").compact_now()["numFilesRemoved"] == 12
    time.sleep(0.5)
    for i in range(12, 24):              # past a checkpoint: it drops the expired tombstones
        appender.append(rows(i * 4, 4))
    live = {os.path.basename(u) for u in deltars.try_open(path).file_uris()}
    two_hours_ago = time.time() - 2 * 3600
    for name in os.listdir(path):
        if name.endswith(".parquet"):
            os.utime(os.path.join(path, name), (two_hours_ago, two_hours_ago))
    stray = os.path.basename(deltars.write_data_file(path, rows(1000, 4)).path)   # an append's file, not committed yet
    assert len([n for n in os.listdir(path) if n.endswith(".parquet")]) == len(live) + 12 + 1
    assert vacuum_delta_rs_table(deltars.try_open(path), 0) == 12
    assert {n for n in os.listdir(path) if n.endswith(".parquet")} == live | {stray}
    seqs = sorted(deltars.try_open(path).to_pyarrow_table(columns=["seq"])["seq"].to_pylist())
    assert seqs == list(range(96))
