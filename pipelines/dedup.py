"""The dedup pipeline: raw PUT log -> delivery log, exactly once.

One Structured Streaming query per partition:

    readStream(delta: partition-NNN/puts)
      -> dedup_puts: drop GUIDs seen within the history window (RocksDB state,
         checkpointed, so the history survives a restart of the job)
      -> foreachBatch: append to partition-NNN/delivery with txnAppId/txnVersion
         (a replayed batch is skipped by Delta), then notify the primary.

PUT order: the delivery log carries each message's partition sequence number
(`seq`, assigned by the primary in commit order); the primary pushes in `seq`
order, so a queue's PUT order is kept whatever the file layout.

Why `put_time` is a safe watermark column: the primary makes it monotonic per
partition (it never goes below the last committed value), so no row is ever
older than the watermark and `dropDuplicatesWithinWatermark` never drops a row
as late; it only drops a GUID seen within the window. The watermark's delay
is half the window (`watermark_delay_ms`: Spark holds a GUID for twice it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from conf import DomainConfig
from pipelines.fanout import DomainsProvider, target_apps_sql
from storage.tables import (
    DELIVERY_LEGACY_COLUMNS,
    DELIVERY_PUTS_VERSION_KEY,
    DELIVERY_SCHEMA,
    PartitionPaths,
    local_checkpoint,
    stream_offset,
)

log = logging.getLogger(__name__)


# The PUT columns the pipeline reads: what the delivery row copies, and the
# properties the fanout's subscriptions test. Selected before the dedup so
# Spark's Parquet reader never decodes a payload: a foreachBatch DataFrame is
# the already-planned micro-batch, and a projection inside it is not pushed
# down into the source.
PIPELINE_PUT_COLUMNS = ("domain", "queue", "guid", "seq", "producer_time", "put_time",
                        "properties", "property_types")


def read_columns(legacy_columns: Sequence[str] = ()) -> list[str]:
    """The PUT-log columns the query selects, with the legacy ones an older
    delivery log needs copied."""
    return [*PIPELINE_PUT_COLUMNS, *(c for c in legacy_columns if c not in PIPELINE_PUT_COLUMNS)]


def put_stream(spark: SparkSession, puts_path: str, max_files_per_trigger: int = 1000,
               legacy_columns: Sequence[str] = ()) -> DataFrame:
    """The PUT log as a stream of the columns the pipeline reads.
    skipChangeCommits: retention removes finished history from the PUT log
    (pipelines/retention.py); those commits hold no new PUTs."""
    return (spark.readStream.format("delta")
            .option("maxFilesPerTrigger", max_files_per_trigger)
            .option("skipChangeCommits", "true")
            .load(puts_path)
            .select(*read_columns(legacy_columns)))


def watermark_delay_ms(history_window_ms: int) -> int:
    """The watermark delay that makes Spark hold a GUID for the window.

    `dropDuplicatesWithinWatermark` keeps a GUID first seen at event time t
    until the watermark (the newest event time less the delay) reaches
    t + delay: for twice the delay. With the window as the delay, a GUID
    resent 1.5 windows later was dropped, where the express lane
    (`primary/express.py`, the same rule as BlazingMQ's history) pushes it,
    and the state held twice the GUIDs it needs, each read by the
    operator's scan for expired ones after every batch. Half the window
    holds each GUID for the window, and until the end of the first batch
    that starts past it (Spark expires after a batch's rows, by the
    watermark of the batches before it)."""
    return max(1, -(-history_window_ms // 2))


def dedup_puts(puts: DataFrame, history_window_ms: int) -> DataFrame:
    """Drop rows whose GUID was already seen within `history_window_ms` (streaming only)."""
    return (puts.withWatermark("put_time", f"{watermark_delay_ms(history_window_ms)} milliseconds")
            .dropDuplicatesWithinWatermark(["guid"]))


def to_delivery_rows(batch: DataFrame, batch_id: int, domains: Mapping[str, DomainConfig] | None = None, *,
                     partition: int | None = None, legacy_columns: Sequence[str] = ()) -> DataFrame:
    """A deduplicated batch as delivery-log rows: what identifies and routes
    each message, when, which batch, and the apps it goes to (`fanout.py`).
    No payload or properties: those stay in the PUT log, joined on (partition,
    seq). `legacy_columns` are copied too, for a delivery log made by an older
    release that has them (NOT NULL there)."""
    rows = (batch.withColumn("partition", F.lit(partition).cast("bigint"))
            .withColumn("delivered_time", F.current_timestamp())
            .withColumn("batch_id", F.lit(batch_id).cast("bigint"))
            .withColumn("apps", F.expr(target_apps_sql(domains or {}))))
    return rows.select(*(f.name for f in DELIVERY_SCHEMA), *legacy_columns)


def write_delivery_batch(batch: DataFrame, batch_id: int, delivery_path: str, app_id: str,
                         domains: Mapping[str, DomainConfig] | None = None, *, partition: int | None = None,
                         puts_version: int | None = None, legacy_columns: Sequence[str] = ()) -> None:
    """Append one micro-batch to the delivery log, exactly once: Delta skips a
    write whose (txnAppId, txnVersion) it has already recorded, so a batch that
    Spark replays after a failure adds no duplicates.

    `puts_version` (the last PUT-log version this batch covers) goes into the
    commit's userMetadata: the primary reads it to know which PUTs the
    pipeline has judged, including those it dropped as duplicates, which leave
    no row (`primary/express.py`).

    The batch is written without counting it first: a count is a second Spark
    job (dropping it took a batch from 1.9 s to 1.55 s on 2 cores). A batch whose rows were
    all duplicates commits an empty version, which readers skip."""
    writer = (to_delivery_rows(batch, batch_id, domains, partition=partition, legacy_columns=legacy_columns)
              .write.format("delta").mode("append")
              .option("txnAppId", app_id).option("txnVersion", batch_id))
    if puts_version is not None:
        writer = writer.option("userMetadata", json.dumps({DELIVERY_PUTS_VERSION_KEY: puts_version}))
    writer.save(delivery_path)


def judged_puts_version(checkpoint: str, batch_id: int) -> int | None:
    """The last PUT-log version that batch `batch_id` covers, from the query's
    offset log (written before the batch runs). The Delta source's end offset
    (reservoirVersion, index) means "every file before `index` of version
    `reservoirVersion`": with index -1 all of the versions before it are
    covered; mid-version, we count only the versions before it (the primary
    then waits one batch longer, never less). None when it cannot be read
    (an object-store checkpoint): the primary then reconciles by delivery rows
    alone."""
    if local_checkpoint(checkpoint) is None:
        return None
    try:
        offset = stream_offset(checkpoint, batch_id)
        if offset.get("isStartingVersion"):
            return None  # still inside the table's initial snapshot
        return int(offset["reservoirVersion"]) - 1
    except (OSError, ValueError) as exc:
        log.warning("offset log of %s, batch %d, not readable (%s): this batch records no judged PUT version",
                    checkpoint, batch_id, exc)
        return None


def legacy_delivery_columns(spark: SparkSession, delivery_path: str) -> tuple[str, ...]:
    existing = set(spark.read.format("delta").load(delivery_path).columns)
    return tuple(c for c in DELIVERY_LEGACY_COLUMNS if c in existing)


def remove_crash_leftovers(checkpoint: str) -> None:
    """Spark writes each offset and commit file to a hidden temp file, then
    renames it. A process killed in between leaves the temp file, and Spark 4.2
    then refuses to start a query whose offsets directory is not empty at
    batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Such a file never
    became part of the checkpoint, so removing it loses nothing. Only called
    before this pipeline starts its query: nothing else writes the checkpoint."""
    import glob
    root = local_checkpoint(checkpoint)
    if root is None:
        return  # object stores write in place (no temp-then-rename): nothing to clean
    for leftover in glob.glob(os.path.join(root, "offsets", ".*.tmp")) + \
            glob.glob(os.path.join(root, "commits", ".*.tmp")):
        log.warning("removing %s, left by a pipeline that was killed while writing it", leftover)
        os.remove(leftover)


def already_written(delivery_path: str, app_id: str, batch_id: int) -> bool:
    from storage import deltars
    table = deltars.try_open(delivery_path)
    version = table.transaction_version(app_id) if table is not None else None
    return version is not None and version >= batch_id


def dedup_query_name(partition: int) -> str:
    return f"taproot-dedup-{partition:03d}"


def start_dedup_query(spark: SparkSession, paths: PartitionPaths, history_window_ms: int, *,
                      trigger_interval_ms: int = 0, max_files_per_trigger: int = 1000,
                      on_batch: Callable[[int, int], None] | None = None, available_now: bool = False,
                      domains: DomainsProvider | None = None) -> StreamingQuery:
    """Start the dedup query for one partition and return it.

    `on_batch(partition, batch_id)` runs after each committed batch (the runner
    uses it to tell the primary there are new delivery rows). `available_now`
    processes what exists and stops (warm-up, tests, catch-up jobs).
    `domains()` gives the current domain configuration for each batch's fanout.
    """
    query_id_ready = threading.Event()
    app_id: list[str] = []
    first_batch = [True]

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        query_id_ready.wait()
        # After a crash Spark replays the last batch, which may already be in
        # the delivery log. Delta would skip that write without running the
        # batch at all, so the dedup state would never commit its version and
        # Spark 4.2 stops the query (STATE_STORE_COMMIT_VALIDATION_FAILED).
        # Run it into a no-op sink instead: state commits, nothing is written.
        if first_batch[0]:
            first_batch[0] = False
            if already_written(paths.delivery, app_id[0], batch_id):
                log.info("partition %d batch %d is already in the delivery log (replayed after a restart)",
                         paths.partition, batch_id)
                batch.write.format("noop").mode("overwrite").save()
                return
        # txnAppId is the query id: stable for a checkpoint, new for a new one
        # (a reused appId with a fresh checkpoint would silently skip writes).
        write_delivery_batch(batch, batch_id, paths.delivery, app_id[0], domains() if domains else None,
                             partition=paths.partition, legacy_columns=legacy,
                             puts_version=judged_puts_version(paths.dedup_checkpoint, batch_id))
        log.debug("partition %d batch %d written in %.0f ms", paths.partition, batch_id,
                  (time.perf_counter() - started) * 1000)
        if on_batch is not None:
            on_batch(paths.partition, batch_id)

    remove_crash_leftovers(paths.dedup_checkpoint)
    legacy = legacy_delivery_columns(spark, paths.delivery)
    puts = put_stream(spark, paths.puts, max_files_per_trigger, legacy)
    writer = (dedup_puts(puts, history_window_ms).writeStream
             .queryName(dedup_query_name(paths.partition))
             .option("checkpointLocation", paths.dedup_checkpoint)
             .foreachBatch(write_batch))
    trigger = {"availableNow": True} if available_now else {"processingTime": f"{trigger_interval_ms} milliseconds"}
    query = writer.trigger(**trigger).start()
    app_id.append(f"taproot-delivery-{query.id}")
    query_id_ready.set()
    return query
