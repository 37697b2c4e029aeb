"""The primary's tail of the delivery log (`storage.deltars.LogTail`): the
rows each new version inserts, read from its commit file and the Parquet
files it adds where the version is a plain append, through delta-rs's change
feed otherwise; the same rows either way (`deltars.read_since`, the change
feed, is the oracle)."""

import datetime
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from storage import deltars, tables

pytestmark = pytest.mark.unit

COLUMNS = ["domain", "queue", "guid", "seq", "apps"]


def delivery_rows(*seqs: int, apps: tuple[str, ...] = ("",)) -> pa.Table:
    now = datetime.datetime.now(datetime.timezone.utc)
    return pa.Table.from_pylist(
        [{"partition": 0, "domain": "d", "queue": f"q{seq % 3}", "guid": seq.to_bytes(16, "big"), "seq": seq,
          "producer_time": now, "put_time": now, "delivered_time": now, "batch_id": seq, "apps": list(apps)}
         for seq in seqs], schema=tables.DELIVERY_SCHEMA)


def delivery_table(tmp_path) -> str:
    path = str(tmp_path / "delivery")
    DeltaTable.create(path, tables.DELIVERY_SCHEMA, configuration=tables.TABLE_PROPERTIES)
    return path


def oracle(path: str, after: int, columns: list[str]) -> tuple[int, pa.Table]:
    """What delta-rs's change feed reads, on a handle opened now."""
    return deltars.read_since(DeltaTable(path), after, columns=columns)


def same(got: tuple[int, pa.Table], want: tuple[int, pa.Table]) -> None:
    (got_version, got_rows), (want_version, want_rows) = got, want
    assert got_version == want_version
    assert got_rows.schema.equals(want_rows.schema), (got_rows.schema, want_rows.schema)
    if want_rows.num_rows:
        order = [("_commit_version", "ascending"), ("seq", "ascending")]
        got_rows, want_rows = got_rows.sort_by(order), want_rows.sort_by(order)
    assert got_rows.to_pylist() == want_rows.to_pylist()


def test_appends_are_read_from_their_commit_files_as_the_change_feed_reads_them(tmp_path):
    path = delivery_table(tmp_path)
    write_deltalake(path, delivery_rows(0, 1), mode="append")
    tail = deltars.LogTail(DeltaTable(path))
    after = tail.table.version()
    for first in range(2, 20, 3):
        write_deltalake(path, delivery_rows(first, first + 1, first + 2, apps=("a", "b")), mode="append")
        write_deltalake(path, delivery_rows(first + 100), mode="append")
    assert tail.read_since(tail.table.version() + 12) == (tail.table.version() + 12, pa.table({}))   # a stat
    got = tail.read_since(after, COLUMNS)
    same(got, oracle(path, after, COLUMNS))
    assert got[1].num_rows == 24 and tail.read_directly == 12 and tail.read_by_delta_rs == 0
    # A column the table lacks comes as nulls, as the change feed's reader gives it.
    same(tail.read_since(after, ["seq", "lost"]), oracle(path, after, ["seq", "lost"]))
    assert tail.read_by_delta_rs == 0


def test_a_rewrite_adds_no_rows_and_changes_or_a_new_schema_go_through_delta_rs(tmp_path):
    """OPTIMIZE's rewrite (dataChange false) is read directly and adds no
    rows; a delete (change data files) and a schema change go through the
    change feed, on a handle moved to them; the appends after are read
    directly again, the new column with them."""
    path = delivery_table(tmp_path)
    for seq in range(6):
        write_deltalake(path, delivery_rows(seq), mode="append")
    tail = deltars.LogTail(DeltaTable(path))
    after = tail.table.version()
    write_deltalake(path, delivery_rows(6, 7), mode="append")
    assert DeltaTable(path).optimize.compact()["numFilesRemoved"] == 7
    write_deltalake(path, delivery_rows(8), mode="append")
    same(tail.read_since(after, COLUMNS), oracle(path, after, COLUMNS))
    assert (tail.read_directly, tail.read_by_delta_rs) == (3, 0)

    after = DeltaTable(path).version()
    DeltaTable(path).delete("seq = 3")                      # change data files
    write_deltalake(path, delivery_rows(9), mode="append")
    same(tail.read_since(after, COLUMNS), oracle(path, after, COLUMNS))
    assert (tail.read_directly, tail.read_by_delta_rs) == (3, 2) and tail.table.version() == after + 2

    after = tail.table.version()
    widened = delivery_rows(10).append_column("region", pa.array(["eu"]))
    write_deltalake(path, widened, mode="append", schema_mode="merge")   # a metaData action
    same(tail.read_since(after, [*COLUMNS, "region"]), oracle(path, after, [*COLUMNS, "region"]))
    assert tail.read_by_delta_rs == 3
    after = tail.table.version()
    write_deltalake(path, delivery_rows(11).append_column("region", pa.array(["us"])), mode="append")
    write_deltalake(path, delivery_rows(12).append_column("region", pa.nulls(1, pa.string())), mode="append")
    got = tail.read_since(after, [*COLUMNS, "region"])
    same(got, oracle(path, after, [*COLUMNS, "region"]))
    assert got[1]["region"].to_pylist() == ["us", None] and (tail.read_directly, tail.read_by_delta_rs) == (5, 3)


def test_a_handle_left_behind_a_trimmed_log_moves_on_for_what_only_delta_rs_reads(tmp_path):
    """Reading appends directly leaves the delta-rs handle where it was;
    once the log behind it is trimmed (`deltars.trim_log`, as the primary
    trims the delivery log), the next version only delta-rs reads (a
    delete) is read by that handle, moved on from the checkpoint."""
    path = delivery_table(tmp_path)
    tail = deltars.LogTail(DeltaTable(path))
    after = tail.table.version()
    for seq in range(25):
        write_deltalake(path, delivery_rows(seq), mode="append")
    latest, rows = tail.read_since(after, COLUMNS)
    assert rows.num_rows == 25 and tail.table.version() == after
    DeltaTable(path).create_checkpoint()
    log_dir = os.path.join(path, "_delta_log")
    for name in os.listdir(log_dir):
        if name[:20].isdigit():
            os.utime(os.path.join(log_dir, name), (0, 0))
    assert deltars.trim_log(path, latest, 0) > 0
    assert not os.path.exists(os.path.join(log_dir, f"{after + 1:020d}.json"))
    DeltaTable(path).delete("seq = 24")
    got = tail.read_since(latest, COLUMNS)
    same(got, oracle(path, latest, COLUMNS))
    assert got[0] == latest + 1 and tail.read_by_delta_rs == 1 and tail.table.version() == latest + 1
