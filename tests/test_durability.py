"""Durable commits: an append returns only once its data file, its commit and
their directory entries are fsynced, in that order; the statistics of a file
Taproot writes itself are the ones delta-rs would write; readers see the same
rows. `primary.durability = "os"` leaves it to the OS."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from storage import deltars, tables

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 11, 23, 9, 0, 45, 469_999, tzinfo=dt.timezone.utc)


def puts(n: int = 4, start: int = 0) -> pa.Table:
    """PUT rows with the cases statistics must get right: micro- and
    millisecond edges, nulls, all-null columns, unicode and long strings."""
    return pa.table({
        "domain": [("z" * 300 if i % 3 == 0 else f"d{i}") for i in range(n)],
        "queue": [("é" if i % 2 else "q" * 100) for i in range(n)],
        "guid": [os.urandom(16) for _ in range(n)],
        "seq": [start + (i * 7) % n for i in range(n)],
        "payload": [b"x" * i for i in range(n)],
        "properties": pa.array([[("k", str(i))] if i % 2 else None for i in range(n)], tables.PROPERTY_MAP),
        "property_types": pa.array([[]] * n, tables.PROPERTY_MAP),
        "producer_time": pa.array([None if i % 2 else T0 + dt.timedelta(microseconds=i) for i in range(n)],
                                  tables.TIMESTAMP),
        "put_time": pa.array([T0 - dt.timedelta(seconds=i, microseconds=999) for i in range(n)], tables.TIMESTAMP),
        "epoch": [1 + i for i in range(n)],
        "compression": pa.array([None] * n, pa.string()),
    }, schema=tables.PUTS_SCHEMA)


def last_add(path: str) -> dict:
    commit = sorted(glob.glob(os.path.join(path, "_delta_log", "*.json")))[-1]
    with open(commit) as fh:
        return next(json.loads(line)["add"] for line in fh if '"add"' in line)


@pytest.mark.parametrize("n", [1, 4, 50])
def test_statistics_are_the_ones_delta_rs_writes(tmp_path, n):
    batch = puts(n)
    write_deltalake(str(tmp_path / "rs"), batch, mode="append")
    assert json.loads(deltars.delta_stats(batch)) == json.loads(last_add(str(tmp_path / "rs"))["stats"])


@pytest.mark.parametrize("longest", ["z" * 300, "é" * 70, "aé" * 40, "\U0010ffff" * 70, "a" + "\U0010ffff" * 40,
                                     "\ud7ff" * 30, "\x7f" * 90])
def test_long_string_bounds_are_the_ones_delta_rs_writes_and_bound_every_value(tmp_path, longest):
    batch = puts(4)
    batch = batch.set_column(1, "queue", pa.array([longest, "a", longest[:70] + "b", "b"]))
    write_deltalake(str(tmp_path / "rs"), batch, mode="append")
    ours = json.loads(deltars.delta_stats(batch))
    assert ours == json.loads(last_add(str(tmp_path / "rs"))["stats"])
    assert ours["minValues"]["queue"] <= min(batch["queue"].to_pylist())
    assert ours["maxValues"]["queue"] >= max(batch["queue"].to_pylist())


def test_a_durable_append_is_read_back_the_same_by_delta_rs(tmp_path):
    appender = deltars.Appender(str(tmp_path / "puts"), tables.PUTS_SCHEMA)
    batches = [puts(4, 0), puts(30, 4)]
    versions = [appender.append(b) for b in batches]
    assert versions == [1, 2]
    table = DeltaTable(str(tmp_path / "puts"))
    assert table.to_pyarrow_table().sort_by("seq").equals(pa.concat_tables(batches).sort_by("seq"))
    # The statistics prune files as delta-rs's own would.
    assert table.to_pyarrow_table(filters=[("seq", ">=", 4)]).num_rows == 30


def fsynced_paths(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_data_then_its_directory_then_the_commit_then_the_log_directory_are_fsynced(tmp_path, monkeypatch):
    """The local log fsyncs the commit's bytes under a temp name, then links
    them to the version's name (put-if-absent) and fsyncs the directory."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    assert appender.log is not None
    calls = fsynced_paths(monkeypatch)
    version = appender.append(puts())
    log_dir = os.path.join(root, "_delta_log")
    data = os.path.join(root, last_add(root)["path"])
    assert calls[:2] == [data, root] and calls[3:] == [log_dir]
    temp = calls[2]
    assert os.path.dirname(temp) == log_dir and os.path.basename(temp).startswith(".taproot-")
    assert not os.path.exists(temp) and os.path.exists(os.path.join(log_dir, f"{version:020d}.json"))
    assert not glob.glob(os.path.join(log_dir, ".taproot-*"))


def test_a_commit_into_reserved_files_keeps_the_order_and_leaves_no_file_behind(tmp_path, monkeypatch):
    """`Appender.reserve` makes the next commit's data file and temp file
    ahead of it, and fsyncs the table's directory there, off the commit's
    path: the commit writes into those two and fsyncs the data file's bytes
    (its entry is durable already), the commit, the log directory, and
    leaves neither the temp nor an unused data file."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    appender.append(puts())
    reserving = fsynced_paths(monkeypatch)
    appender.reserve()
    deadline = time.monotonic() + 10
    while appender._reserved is None:       # made by the appender's reserve thread
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert reserving == [root]
    data_name, temp, _ = appender._reserved
    assert os.path.getsize(os.path.join(root, data_name)) == 0 and os.path.getsize(temp) == 0
    calls = fsynced_paths(monkeypatch)
    version = appender.append(puts())
    assert last_add(root)["path"] == data_name and os.path.getsize(os.path.join(root, data_name)) > 0
    log_dir = os.path.join(root, "_delta_log")
    assert calls == [os.path.join(root, data_name), temp, log_dir]
    assert not os.path.exists(temp) and os.path.exists(os.path.join(log_dir, f"{version:020d}.json"))
    assert not glob.glob(os.path.join(log_dir, ".taproot-*"))
    assert deltars.try_open(root).to_pyarrow_table().num_rows == 2 * puts().num_rows


def test_every_fsync_is_timed_for_the_nodes_metrics(tmp_path):
    """`taproot_fsync_seconds`: the disk's sync latency, which each durable
    commit waits for; a commit without reserved files makes four fsyncs."""
    appender = deltars.Appender(str(tmp_path / "puts"), tables.PUTS_SCHEMA)
    count, total = deltars.FSYNC_SECONDS.count, deltars.FSYNC_SECONDS.sum
    appender.append(puts())
    # At least: a thread of an earlier test may fsync meanwhile.
    assert deltars.FSYNC_SECONDS.count >= count + 4 and deltars.FSYNC_SECONDS.sum > total


def test_through_delta_rs_the_same_order_is_kept(tmp_path, monkeypatch):
    """The delta-rs commit path (object stores, protocols the local log does
    not write): data, its directory, the commit file, the log directory."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    appender.log = None
    calls = fsynced_paths(monkeypatch)
    version = appender.append(puts())
    data = os.path.join(root, last_add(root)["path"])
    commit = os.path.join(root, "_delta_log", f"{version:020d}.json")
    assert calls == [data, root, commit, os.path.join(root, "_delta_log")]


def test_a_checkpoint_made_by_a_commit_is_fsynced_with_it(tmp_path, monkeypatch):
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    for i in range(8):
        appender.append(puts(2, 2 * i))
    calls = fsynced_paths(monkeypatch)
    version = appender.append(puts(2, 100))  # the tenth commit: checkpointInterval = 10
    assert version == 9
    log_dir = os.path.join(root, "_delta_log")
    assert calls[-3:] == [os.path.join(log_dir, "00000000000000000009.checkpoint.parquet"),
                          os.path.join(log_dir, "_last_checkpoint"), log_dir]


def test_a_durable_append_that_conflicts_commits_its_file_again(tmp_path):
    """Another writer commits between our file and our commit: the append is
    retried with the same data file, and both commits' rows are there once."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    other = deltars.Appender(root, tables.PUTS_SCHEMA)
    other.append(puts(3, 0))  # our handle is now one version behind
    assert appender.append(puts(5, 10)) == 2
    assert sorted(DeltaTable(root).to_pyarrow_table()["seq"].to_pylist()) == [0, 1, 2, 10, 11, 12, 13, 14]
    assert len(glob.glob(os.path.join(root, "*.parquet"))) == 2


def test_an_unsettled_append_reads_its_version_from_the_log_and_settles_before_the_next(tmp_path, monkeypatch):
    """`settle=False`: the version comes from the log, not from a handle update;
    the commit is as durable as a settled one; the next append (or `settle`)
    moves the handle first, so its commit does not race its own previous one."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA, epoch=1)   # version 0 creates, 1 claims
    appender.log = None   # delta-rs's commit path
    updates = []
    real = appender.table.update_incremental
    monkeypatch.setattr(appender.table, "update_incremental", lambda: (updates.append(1), real())[1])
    calls = fsynced_paths(monkeypatch)
    assert appender.append(puts(3, 0), settle=False) == 2
    assert updates == [] and appender.table.version() == 1
    assert calls[-2:] == [os.path.join(root, "_delta_log", f"{2:020d}.json"), os.path.join(root, "_delta_log")]
    assert appender.append(puts(3, 3), settle=False) == 3   # settled first: one update, then a commit
    assert updates == [1]
    appender.settle()
    appender.settle()                                          # once only
    assert updates == [1, 1] and appender.table.version() == 3
    assert sorted(DeltaTable(root).to_pyarrow_table()["seq"].to_pylist()) == [0, 1, 2, 3, 4, 5]


def test_an_unsettled_append_finds_its_commit_past_another_writers(tmp_path):
    """Another writer's commit lands between the handle's version and ours:
    the version read from the log is ours, the one naming our data file."""
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    appender.log = None   # delta-rs's commit path
    appender.append(puts(1, 0))
    other = deltars.Appender(root, tables.PUTS_SCHEMA)
    other.append(puts(2, 10))                                  # version 2; our handle is at 1
    version = appender.append(puts(3, 20), settle=False)
    assert version == 3
    assert deltars.committed_version(root, 1, last_add(root)["path"]) == 3
    assert deltars.committed_version(root, 1, "part-00000-not-there.parquet") is None
    appender.settle()
    assert appender.table.version() == 3


def test_os_durability_and_object_stores_keep_delta_rs_s_writer(tmp_path, monkeypatch):
    calls = fsynced_paths(monkeypatch)
    appender = deltars.Appender(str(tmp_path / "puts"), tables.PUTS_SCHEMA, durable=False)
    appender.append(puts())
    assert calls == []
    assert deltars.local_root("s3://bucket/t") is None
    assert deltars.local_root("file:///data/t") == "/data/t"
    assert deltars.local_root("/data/t") == "/data/t"



@pytest.mark.parametrize("torn", [b"", b'{"commitInfo":{"timestamp":1', b'{"add": {"path": "x"}}\n{"remo'],
                         ids=["empty", "cut-in-a-record", "cut-after-a-record"])
def test_a_commit_cut_short_by_a_power_loss_is_set_aside_and_the_table_opens_before_it(tmp_path, torn):
    root = str(tmp_path / "puts")
    appender = deltars.Appender(root, tables.PUTS_SCHEMA)
    appender.append(puts(3, 0))
    appender.append(puts(3, 10))
    commit = os.path.join(root, "_delta_log", f"{2:020d}.json")
    with open(commit, "wb") as fh:
        fh.write(torn)
    reopened = deltars.Appender(root, tables.PUTS_SCHEMA, epoch=None)
    assert os.path.exists(commit + ".torn") and not os.path.exists(commit)
    assert reopened.table.version() == 1
    assert reopened.append(puts(2, 20)) == 2
    assert sorted(DeltaTable(root).to_pyarrow_table()["seq"].to_pylist()) == [0, 1, 2, 20, 21]


def test_a_whole_commit_is_left_alone(tmp_path):
    root = str(tmp_path / "puts")
    deltars.Appender(root, tables.PUTS_SCHEMA).append(puts(3, 0))
    assert deltars.set_aside_torn_commit(root) is None
    assert DeltaTable(root).version() == 1


def test_commit_info_is_read_by_version_even_when_the_log_has_moved_on(tmp_path):
    """delta-rs's history() on a table loaded at an older version put the
    newest commit's metadata under the loaded version; commit_info reads the
    version's own file, and a file cut short or gone gives None."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(path, pa.table({"x": [i]}), mode="append",
                        commit_properties=CommitProperties(custom_metadata={"userMetadata": json.dumps({"n": i})}))
    old = DeltaTable(path, version=1)
    assert json.loads(deltars.commit_info(old, 1)["userMetadata"]) == {"n": 1}
    assert json.loads(deltars.commit_info(old, 2)["userMetadata"]) == {"n": 2}
    assert deltars.commit_info(old, 7) is None
    log_file = tmp_path / "t" / "_delta_log" / f"{2:020d}.json"
    log_file.write_bytes(log_file.read_bytes()[:10])
    assert deltars.commit_info(old, 2) is None
