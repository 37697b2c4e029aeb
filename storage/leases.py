"""Primary leases and fencing, held through Delta commits (no coordination service).

One lease per partition, in a small Delta table `partition-NNN/lease` that
delta-rs writes. Its epoch is the version of the app transaction `LEASE_APP`
recorded in the table's log:

- **acquire**: commit `txn(LEASE_APP, epoch + 1)` with a row naming the new
  holder and its address;
- **renew**: an empty commit carrying `txn(LEASE_APP, epoch)`;
- **release** (graceful stop): a row with `released = true` at the same epoch.

Two nodes racing to take or renew the lease both write `_delta_log/N.json`
put-if-absent; the loser's retry meets a commit carrying the same app id and
fails with a concurrent-transaction conflict (`reference/spark-delta.md` §3,
verified with delta-rs). Each writer also checks the epoch on its snapshot
first, because delta-rs does not refuse a lower txn version by itself.

**Fencing.** The same epoch guards the partition's data tables (PUT, confirm
and dead-letter logs): a new primary first commits a marker carrying
`txn(PRIMARY_APP, epoch)` to each (`FencedAppender.fence`), and every data
commit carries `txn(PRIMARY_APP, my_epoch)`. A stale primary's next commit then
either meets the marker as a concurrent transaction or, if its snapshot is
newer than the marker, sees a foreign epoch; both raise `Fenced`, and the
partition steps down.

**Lapse without synchronised clocks.** A follower never compares wall clocks:
it notes, on its own monotonic clock, when it last saw the lease table's
version change; `lease_duration_ms` without a change means the holder stopped
renewing. The holder renews every `renew_interval_ms` and steps down by itself
once `lease_duration_ms` has passed since the start of its last successful
renewal, which is always before any follower can have seen the lease lapse.

`storage.lease_machine.LeaseMachine` is the pure part (time comes in as an
argument); `LeaseTable` here does the Delta I/O. Neither is thread safe: the
node's lease keeper (`primary.leadership`) owns both.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from storage.lease_machine import LeaseView

log = logging.getLogger(__name__)

LEASE_APP = "taproot-lease"
PRIMARY_APP = "taproot-primary"
LEASE_SCHEMA = pa.schema([
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("holder", pa.string(), nullable=False),
    pa.field("address", pa.string(), nullable=False),
    pa.field("released", pa.bool_(), nullable=False),
    pa.field("time_us", pa.int64(), nullable=False),
])
# Renewals add one small commit per interval (two a second at the shipped
# 500 ms), and on a local disk delta-rs lists the whole `_delta_log/` at every
# refresh and commit: a renewal took 6 ms of CPU with 55 log files, 11 with
# 530 and 38 with 3,150, a follower's read 2, 3 and 6 ms (`lease_cost.py.txt`,
# docs/bench/twenty-sixth-2026-12-07). An hour of log, as these tables kept
# before, is 7,200 files: about 90 ms a renewal by a straight line through
# those, a fifth of a core for each partition a node leads. So: checkpoint
# often and keep a minute of log (130 files at two renewals a second).
# The latest state is all a lease reader needs; one further behind than
# that starts again from the newest checkpoint (delta-rs does so).
LEASE_LOG_RETENTION = "interval 1 minutes"
LEASE_TABLE_PROPERTIES = {
    "delta.checkpointInterval": "20",
    "delta.logRetentionDuration": LEASE_LOG_RETENTION,
}


class Fenced(Exception):
    """A newer primary holds this partition: the commit was refused."""


def _commit_properties(app: str, epoch: int, retries: int = 0) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app, epoch)], max_commit_retries=retries)


class LeaseTable:
    """Delta I/O for one partition's lease table."""

    def __init__(self, path: str, storage_options: dict[str, str] | None = None):
        self.path = path
        self.storage_options = storage_options
        self._table: DeltaTable | None = None
        # The holder row of the last read, keyed by (epoch, data files): renewals
        # are empty commits, so only an acquire or a release changes it, and a
        # follower polling every 100 ms need not read Parquet each time.
        self._holder_key: tuple[int, int] | None = None
        self._holder: tuple[str, str, bool] = ("", "", False)
        self._properties_settled = False   # `_settle_properties`, after this object's writes until it is

    def _open(self, create: bool = False) -> DeltaTable | None:
        if self._table is None:
            try:
                self._table = DeltaTable(self.path, storage_options=self.storage_options)
            except TableNotFoundError:
                if not create:
                    return None
                self._table = DeltaTable.create(self.path, LEASE_SCHEMA, mode="ignore",
                                                configuration=LEASE_TABLE_PROPERTIES,
                                                storage_options=self.storage_options)
        return self._table

    def read(self) -> LeaseView | None:
        table = self._open()
        if table is None:
            return None
        table.update_incremental()
        epoch = table.transaction_version(LEASE_APP) or 0
        key = (epoch, len(table.file_uris()))
        if key != self._holder_key:
            self._holder, self._holder_key = ("", "", False), key
            if epoch:
                rows = table.to_pyarrow_table(filters=[("epoch", "=", epoch)])
                if rows.num_rows:
                    last = rows.sort_by([("time_us", "descending")]).slice(0, 1).to_pylist()[0]
                    self._holder = (last["holder"], last["address"], last["released"])
        holder, address, released = self._holder
        return LeaseView(table.version(), epoch, holder, address, released)

    def _write(self, app_epoch: int, row: dict[str, Any] | None, expected_epoch: int,
               expected_version: int | None = None) -> bool:
        """Commit (a row or nothing) carrying txn(LEASE_APP, app_epoch), provided
        the snapshot's epoch is still `expected_epoch` (and, if given, the
        table is still at `expected_version`). False if anyone else committed
        a lease change first."""
        table = self._open(create=True)
        assert table is not None
        table.update_incremental()
        if (table.transaction_version(LEASE_APP) or 0) != expected_epoch:
            return False
        if expected_version is not None and table.version() != expected_version:
            return False  # renewed since the caller saw it lapse: the holder is alive
        data = pa.Table.from_pylist([row] if row else [], schema=LEASE_SCHEMA)
        try:
            write_deltalake(table, data, mode="append",
                            commit_properties=_commit_properties(LEASE_APP, app_epoch, retries=3),
                            post_commithook_properties=PostCommitHookProperties(
                                create_checkpoint=True, cleanup_expired_logs=True))
        except CommitFailedError as exc:
            log.info("lease %s: commit for epoch %d lost a race: %s", self.path, app_epoch, exc)
            table.update_incremental()
            return False
        if not self._properties_settled:
            self._properties_settled = self._settle_properties(table)
        return True

    def _settle_properties(self, table: DeltaTable) -> bool:
        """A lease table made with other properties (an hour of log, before
        2026-12-07) gets `LEASE_TABLE_PROPERTIES`: one metadata commit, by
        a node that wrote to it, after its write (so a write of its own
        never waits on it or loses to it). True once the table has them.
        Never raises: the write it follows has landed, and a commit that
        fails here (another node's write won the version) is tried again
        after this node's next write."""
        from storage import deltars  # (it imports this module)

        try:
            table.update_incremental()
            if not deltars.set_properties(table, LEASE_TABLE_PROPERTIES):
                return True
        except Exception as exc:   # (CommitFailedError, or the store's own errors)
            log.info("lease %s: setting the table properties failed; trying again after the next write: %s",
                     self.path, exc)
            return False
        log.info("lease %s: table properties set to %s", self.path, LEASE_TABLE_PROPERTIES)
        return True

    def acquire(self, epoch: int, holder: str, address: str, now_us: int,
                expected_version: int | None = None) -> bool:
        """Take the lease at `epoch`. With `expected_version` (the version the
        follower watched lapse), a renewal that landed since wins instead."""
        return self._write(epoch, {"epoch": epoch, "holder": holder, "address": address, "released": False,
                                   "time_us": now_us}, expected_epoch=epoch - 1, expected_version=expected_version)

    def renew(self, epoch: int) -> bool:
        return self._write(epoch, None, expected_epoch=epoch)

    def release(self, epoch: int, holder: str, address: str, now_us: int) -> bool:
        return self._write(epoch, {"epoch": epoch, "holder": holder, "address": address, "released": True,
                                   "time_us": now_us}, expected_epoch=epoch)


class FencedAppender:
    """Appends to one of the primary's tables, every commit stamped with the
    primary's epoch. Wraps a `storage.deltars.Appender`'s table handle."""

    def __init__(self, table: DeltaTable, epoch: int, schema: pa.Schema):
        self.table = table
        self.epoch = epoch
        self.schema = schema

    def fence(self) -> None:
        """Claim the table for this epoch: an empty commit carrying
        txn(PRIMARY_APP, epoch). Raises `Fenced` if a newer epoch is there."""
        self.check()
        try:
            write_deltalake(self.table, self.schema.empty_table(),
                            mode="append", commit_properties=self.commit_properties(retries=3))
        except CommitFailedError as exc:
            self.table.update_incremental()
            self.check()
            raise Fenced(f"{self.table.table_uri}: claim for epoch {self.epoch} failed: {exc}") from exc

    def check(self) -> None:
        """Raise `Fenced` if the handle's snapshot shows another primary's epoch."""
        current = self.table.transaction_version(PRIMARY_APP) or 0
        if current > self.epoch:
            raise Fenced(f"{self.table.table_uri}: primary epoch is {current}, this primary's is {self.epoch}")

    def check_actions(self, actions: list[dict[str, Any]]) -> None:
        """Raise `Fenced` if a commit's actions (its log file's JSON lines)
        claim a newer epoch than this primary's."""
        for action in actions:
            txn = action.get("txn")
            if isinstance(txn, dict) and txn.get("appId") == PRIMARY_APP and int(txn.get("version", 0)) > self.epoch:
                raise Fenced(f"{self.table.table_uri}: primary epoch {txn['version']} committed, "
                             f"this primary's is {self.epoch}")

    def txn_action(self) -> dict[str, Any]:
        """The app transaction every commit of this primary carries, as a log action."""
        return {"txn": {"appId": PRIMARY_APP, "version": self.epoch}}

    def commit_properties(self, retries: int | None = None) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction(PRIMARY_APP, self.epoch)],
                                max_commit_retries=retries)
