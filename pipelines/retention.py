"""Retention and table maintenance: remove finished history, compact, vacuum.

For each partition, a message is removed from every table once it is
**finished** and **old**:

- finished: each app in its delivery row's `apps` confirmed it or had it
  dead-lettered (a message no app's subscription matched, `apps = []`, is
  finished at once);
- old: its `put_time` is older than the domain's `retention_ms` and than its
  dedup history window (`dedup_history_window_ms`), so the pipeline's GUID
  history no longer needs it. A domain with `retention_ms = 0` keeps everything.

The newest message of each partition is always kept: the primary resumes its
sequence numbers from the PUT log's largest `seq`. A message that is
unconfirmed, still in the dedup window, or not yet delivered is never touched.

Order, so that a crash half-way loses nothing and redelivers nothing: the
delivery log first (then the primary no longer sees the message on restart),
then the PUT log, then the confirm log. Dead letters older than the retention
are removed too.

One writer engine per table (shared design): the delivery log is Spark's, so
Spark deletes from it (MERGE), compacts (OPTIMIZE) and vacuums it. The PUT
and confirm logs are the primary's: on a local disk the delete writes its
commit as the primary's appends do (`deltars.delete_rows`, put-if-absent
into `_delta_log`, so a primary appending every few milliseconds cannot
starve it), on an object store delta-rs's MERGE does it; delta-rs deletes
from the dead-letter log and vacuums all three. All of these commits are
change-free for readers: the deleted rows go to change data files, so a
change-feed reader (a federation link) sees deletes and no inserts from
them, and the dedup stream skips them (`skipChangeCommits`). Vacuum keeps
files younger than `vacuum_retention_hours`, which must exceed how far
behind a reader (the dedup stream, a time-travel query) may be.

The primary's PUT and confirm logs keep their tombstones (the remove
actions of compacted files) only 5 minutes (`tables.PRIMARY_TABLE_PROPERTIES`),
and delta-rs's default vacuum deletes only files with a tombstone still in
the log: on its own it would leave every compacted commit file on disk for
good. `vacuum_delta_rs_table` therefore also runs delta-rs's full vacuum,
which deletes every file the table does not reference and that is older
than the retention (at least `FULL_VACUUM_MIN_HOURS`: a durable append or a
compaction writes its file moments before the commit that references it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties

import conf
from storage import deltars, tables

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession


log = logging.getLogger(__name__)


@dataclass
class PartitionReport:
    partition: int
    removed_messages: int = 0
    removed_put_rows: int = 0
    removed_confirm_rows: int = 0
    removed_dead_letters: int = 0
    vacuumed_files: int = 0
    seconds: float = 0.0


@dataclass
class Report:
    partitions: list[PartitionReport] = field(default_factory=list)

    def summary(self) -> str:
        lines = []
        for p in self.partitions:
            lines.append(f"partition {p.partition}: removed {p.removed_messages} finished messages "
                         f"({p.removed_put_rows} PUT rows, {p.removed_confirm_rows} confirms), "
                         f"{p.removed_dead_letters} dead letters; vacuumed {p.vacuumed_files} files "
                         f"in {p.seconds:.1f} s")
        return "\n".join(lines)


def _cutoffs_sql(domains: dict[str, conf.DomainConfig], now: datetime) -> str | None:
    """A SQL boolean over (domain, put_time): true for rows old enough to go."""
    branches = []
    for name, d in sorted(domains.items()):
        if d.mode == "broadcast" or not d.retention_ms:
            continue
        keep_ms = max(d.retention_ms, d.dedup_history_window_ms)
        cutoff = (now - timedelta(milliseconds=keep_ms)).strftime("%Y-%m-%d %H:%M:%S.%f")
        branches.append(f"(domain = '{name}' AND put_time < TIMESTAMP '{cutoff}+00:00')")
    return " OR ".join(branches) if branches else None


def removable_guids(spark: "SparkSession", paths: tables.PartitionPaths, domains: dict[str, conf.DomainConfig],
                    now: datetime) -> "DataFrame | None":
    """DataFrame(guid, seq) of the partition's finished, old messages (the newest
    kept); None when no domain has a retention."""
    old = _cutoffs_sql(domains, now)
    if old is None:
        return None
    delivery = spark.read.format("delta").load(paths.delivery)
    targets = delivery.where(old).selectExpr("guid", "seq", "explode_outer(coalesce(apps, array(''))) AS app_id")
    done = None
    for path in (paths.confirms, paths.dead_letters):
        if deltars.try_open(path) is not None:
            part = spark.read.format("delta").load(path).select("guid", "app_id")
            done = part if done is None else done.unionByName(part)
    waiting = targets.where("app_id IS NOT NULL")
    if done is not None:
        waiting = waiting.join(done.distinct(), ["guid", "app_id"], "left_anti")
    newest = delivery.selectExpr("max(seq) AS seq")
    return (targets.select("guid", "seq").distinct()
            .join(waiting.select("guid").distinct(), "guid", "left_anti")
            .join(newest, "seq", "left_anti")
            .select("guid", "seq"))


FULL_VACUUM_MIN_HOURS = 1
DELETE_COMMIT_RETRIES = 100


def delete_guids(table: "DeltaTable", guids: list[bytes], seqs: tuple[int, int] | None = None) -> int:
    """Delete the rows of `guids` from one of the primary's logs (PUTs or
    confirms); return how many went. `seqs`: the lowest and highest seq of
    those messages, to skip files by their statistics.

    On a local disk the delete commits through its own `LocalLog`
    (`deltars.delete_rows`), as the primary's appends do: a lost race there
    costs a link and reading the winner's JSON, so it keeps up with a
    primary committing every few milliseconds. Elsewhere, delta-rs's MERGE
    (`_merge_delete`)."""
    deleted = deltars.delete_rows(table, guids, seqs)
    return _merge_delete(table, guids) if deleted is None else deleted


def _merge_delete(table: "DeltaTable", guids: list[bytes]) -> int:
    """delta-rs's MERGE of `guids` into a delete. The primary appends
    to the log all the while, and delta-rs refuses a MERGE when a file was
    added since it read the table that its condition might match ("a
    concurrent transactions added new data"): with the GUIDs alone, any
    append. So the condition also bounds `seq` by its largest value in the
    snapshot read: every row the MERGE should delete is in that snapshot,
    and the files appended since hold larger seqs by their statistics (the
    PUT log always; the confirm log unless a consumer confirms an older
    message late, which makes this MERGE fail and the next round try
    again). delta-rs retries a lost race 15 times by default; a primary
    committing every few milliseconds still outruns 100 (measured), and
    retention then waits for its next round."""
    bound = _snapshot_max_seq(table)   # None: files without statistics; the GUIDs alone then
    condition = "t.guid = s.guid" + ("" if bound is None else f" AND t.seq <= {bound}")
    arrow = pa.table({"guid": pa.array(guids, pa.binary())})
    metrics = (table.merge(arrow, condition, source_alias="s", target_alias="t",
                           commit_properties=CommitProperties(max_commit_retries=DELETE_COMMIT_RETRIES))
               .when_matched_delete().execute())
    return int(metrics.get("num_target_rows_deleted", 0))


def _snapshot_max_seq(table: "DeltaTable") -> int | None:
    """The largest `seq` in the table's snapshot, from its files' statistics;
    None when a file has none."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if "max.seq" not in actions.column_names or actions.num_rows == 0 or actions["max.seq"].null_count:
        return None
    return int(pc.max(actions["max.seq"]).as_py())


def vacuum_delta_rs_table(table: "DeltaTable", retain_hours: int) -> int:
    """Vacuum a table delta-rs writes; return how many files went: those its
    tombstones name, older than `retain_hours`, then every file it does not
    reference that is older than that and `FULL_VACUUM_MIN_HOURS` (the
    compacted files whose tombstones have already expired)."""
    gone = len(table.vacuum(retention_hours=retain_hours, dry_run=False, enforce_retention_duration=False))
    return gone + len(table.vacuum(retention_hours=max(retain_hours, FULL_VACUUM_MIN_HOURS), dry_run=False,
                                   enforce_retention_duration=False, full=True))


def maintain_partition(spark: "SparkSession", paths: tables.PartitionPaths, domains: dict[str, conf.DomainConfig], *,
                       now: datetime | None = None, vacuum_retention_hours: int = 24,
                       target_file_bytes: int = 16 * 1024 * 1024) -> PartitionReport:
    from delta.tables import DeltaTable as SparkDeltaTable

    started = time.monotonic()
    now = now or datetime.now(timezone.utc)
    report = PartitionReport(paths.partition)
    if deltars.try_open(paths.delivery) is None or deltars.try_open(paths.puts) is None:
        return report
    phases: list[tuple[str, float]] = []

    def phase(name: str) -> None:
        phases.append((name, time.monotonic()))

    gone = removable_guids(spark, paths, domains, now)
    found = [] if gone is None else gone.collect()
    guids: list[bytes] = [r.guid for r in found]
    seqs = (min(r.seq for r in found), max(r.seq for r in found)) if found else None
    phase("select")
    report.removed_messages = len(guids)
    if guids:
        source = spark.createDataFrame([(g,) for g in guids], "guid binary")
        # 1. Delivery log (Spark's): the primary stops seeing them on restart.
        (SparkDeltaTable.forPath(spark, paths.delivery).alias("t")
         .merge(source.alias("s"), "t.guid = s.guid").whenMatchedDelete().execute())
        # 2. PUT log and 3. confirm log (delta-rs's).
        for path, attr in ((paths.puts, "removed_put_rows"), (paths.confirms, "removed_confirm_rows")):
            table = deltars.try_open(path)
            if table is not None:
                setattr(report, attr, delete_guids(table, guids, seqs))
    phase("delete")
    dead = deltars.try_open(paths.dead_letters)
    if dead is not None:
        for name, d in domains.items():
            if d.retention_ms:
                cutoff = (now - timedelta(milliseconds=d.retention_ms)).strftime("%Y-%m-%d %H:%M:%S.%f")
                metrics = dead.delete(f"domain = '{name}' AND dead_time < '{cutoff}'")
                report.removed_dead_letters += int(metrics.get("num_deleted_rows", 0))
        dead.optimize.compact(target_size=target_file_bytes)
    phase("dead letters")
    # Compaction: the delivery log by Spark; puts/confirms are compacted by the primary as it writes.
    spark.sql(f"OPTIMIZE delta.`{paths.delivery}`")
    phase("optimize")
    # Vacuum: files no version younger than the retention needs.
    retain = max(0, vacuum_retention_hours)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", str(retain >= 168).lower())
    vacuumed = spark.sql(f"VACUUM delta.`{paths.delivery}` RETAIN {retain} HOURS").count()
    phase("vacuum delivery")
    for path in (paths.puts, paths.confirms, paths.dead_letters):
        table = deltars.try_open(path)
        if table is not None:
            vacuumed += vacuum_delta_rs_table(table, retain)
    report.vacuumed_files = vacuumed
    phase("vacuum the rest")
    report.seconds = time.monotonic() - started
    marks = [started] + [at for _, at in phases]
    log.info("partition %d maintained in %.1f s: %s", paths.partition, report.seconds,
             ", ".join(f"{name} {end - begin:.1f} s" for (name, end), begin in zip(phases, marks)))
    return report


def maintain(spark: "SparkSession", config: conf.ClusterConfig, *, now: datetime | None = None,
             vacuum_retention_hours: int | None = None) -> Report:
    report = Report()
    hours = config.maintenance.vacuum_retention_hours if vacuum_retention_hours is None else vacuum_retention_hours
    for index in range(config.partitions):
        report.partitions.append(maintain_partition(
            spark, tables.PartitionPaths(config.data_dir, index), dict(config.domains), now=now,
            vacuum_retention_hours=hours, target_file_bytes=config.primary.compact_target_file_bytes))
    return report
