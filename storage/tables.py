"""Every Taproot table: its path, its schema, and which engine writes it.

Layout under the cluster's data directory (a local path or an object-store URI):

    <data>/partition-NNN/puts       raw PUT log       writer: primary (delta-rs)
    <data>/partition-NNN/delivery   delivery log      writer: pipeline (Spark)
    <data>/partition-NNN/confirms   confirm log       writer: primary (delta-rs)
    <data>/partition-NNN/dead_letters  dead letters   writer: primary (delta-rs)
    <data>/partition-NNN/disagreements express vs pipeline   writer: primary (delta-rs)
    <data>/_checkpoints/...         Spark checkpoints (dedup state lives here)

One writer engine per table (see shared design): Spark's and delta-rs's commit
protocols do not exclude each other on a local filesystem or S3. Tables stay
append-only at a protocol both engines read (reader 1, writer 2).

Message properties are stored as two string maps so that Spark SQL can filter on
them directly (`properties['region'] = 'EU'`): `properties` holds each value
rendered as text (binary values base64), `property_types` its type name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
PROPERTY_MAP = pa.map_(pa.string(), pa.string())

PUTS_SCHEMA = pa.schema([
    pa.field("domain", pa.string(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),        # queue name within the domain
    pa.field("guid", pa.binary(), nullable=False),         # 16 bytes, made by the SDK
    pa.field("seq", pa.int64(), nullable=False),           # partition sequence: PUT order
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("properties", PROPERTY_MAP),
    pa.field("property_types", PROPERTY_MAP),
    pa.field("producer_time", TIMESTAMP),                  # producer's clock when posted
    pa.field("put_time", TIMESTAMP, nullable=False),       # primary's clock at commit
    pa.field("epoch", pa.int64(), nullable=False),         # primary lease epoch that wrote it
    pa.field("compression", pa.string()),                  # null, "zlib" or "zstd" (done by the SDK)
])

# The delivery log identifies and routes; it copies no payload or properties
# (the payload is stored once, in the PUT log: join on (partition, seq)).
DELIVERY_SCHEMA = pa.schema([
    pa.field("partition", pa.int64()),                      # the storage partition (also in the path)
    pa.field("domain", pa.string(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("guid", pa.binary(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),            # the PUT row's seq in the same partition
    pa.field("producer_time", TIMESTAMP),
    pa.field("put_time", TIMESTAMP, nullable=False),
    pa.field("delivered_time", TIMESTAMP, nullable=False),  # when the pipeline appended it
    pa.field("batch_id", pa.int64(), nullable=False),       # pipeline micro-batch id
    # The apps the message goes to: every fanout app whose subscription matches
    # ([""] in a priority domain). An app left out auto-confirmed the message.
    # One row per message whatever the number of apps.
    pa.field("apps", pa.list_(pa.string())),
])
# Columns a delivery log made by Taproot 0.x (before the express lane) also
# has: copies of the PUT row. The pipeline keeps filling them in such a table
# (they are NOT NULL there); readers take them from the PUT log.
DELIVERY_LEGACY_COLUMNS = ("payload", "properties", "property_types", "epoch", "compression")
# Each delivery commit records, in its commitInfo.userMetadata, the last PUT-log
# version the pipeline has judged (every row up to it is either in the delivery
# log or was dropped as a duplicate): {"puts_version": N}.
DELIVERY_PUTS_VERSION_KEY = "puts_version"

# What the express lane and the pipeline decided differently for a message
# (primary/express.py). Written by the primary (delta-rs).
DISAGREEMENTS_SCHEMA = pa.schema([
    pa.field("domain", pa.string(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("guid", pa.binary(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("express_apps", pa.list_(pa.string())),    # what the primary pushed to; null: judged a duplicate
    pa.field("pipeline_apps", pa.list_(pa.string())),   # the delivery row's apps; null: no row (a duplicate)
    pa.field("late_apps", pa.list_(pa.string())),       # pushed when the delivery row came
    pa.field("kind", pa.string(), nullable=False),      # dedup | apps
    pa.field("epoch", pa.int64(), nullable=False),      # the primary's lease epoch
    pa.field("detected_time", TIMESTAMP, nullable=False),
])

# Messages taken out of delivery: poison pills (`max_delivery_attempts`) and
# messages whose TTL passed before they were pushed.
DEAD_LETTERS_SCHEMA = pa.schema([
    pa.field("domain", pa.string(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("app_id", pa.string(), nullable=False),
    pa.field("guid", pa.binary(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("payload", pa.binary(), nullable=False),
    pa.field("properties", PROPERTY_MAP),
    pa.field("property_types", PROPERTY_MAP),
    pa.field("compression", pa.string()),
    pa.field("producer_time", TIMESTAMP),                    # as in the PUT log (join on guid for the rest)
    pa.field("delivery_count", pa.int64(), nullable=False),  # pushes before it was removed
    pa.field("reason", pa.string(), nullable=False),         # max_delivery_attempts | ttl_expired
    pa.field("detail", pa.string()),
    pa.field("dead_time", TIMESTAMP, nullable=False),
])
DEAD_REASON_ATTEMPTS = "max_delivery_attempts"
DEAD_REASON_TTL = "ttl_expired"

CONFIRMS_SCHEMA = pa.schema([
    pa.field("domain", pa.string(), nullable=False),
    pa.field("queue", pa.string(), nullable=False),
    pa.field("app_id", pa.string(), nullable=False),       # "" for priority queues
    pa.field("guid", pa.binary(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("confirm_time", TIMESTAMP, nullable=False),
])

# Table properties both engines honour; set explicitly because delta-rs defaults
# to a checkpoint every 100 commits and delta-spark to every 10.
# The change data feed is on so that data teams (and the primary's tailer) can
# read each version's new rows; for append-only tables it costs nothing extra.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10", "delta.enableChangeDataFeed": "true"}
# The tables the primary writes (PUTs, confirms) also keep the tombstones of
# compacted files for 5 minutes, not Delta's week. Every checkpoint (one per 10
# commits) carries each unexpired tombstone, and every commit file is removed
# once by compaction: with a week's, the checkpoint grows by a row per commit
# (at 10 commits/s, 864,000 a day), and so does the cost of writing it
# (`taproot_ops.bench.commits`). delta-rs's default vacuum deletes only files
# a tombstone still names, so maintenance also vacuums these tables in full
# (`pipelines.retention.vacuum_delta_rs_table`), which deletes any file the
# table no longer references once older than its retention. Spark will not time travel
# past this retention, but these logs are trimmed after seconds
# (`primary.log_retention_s`), so nothing older could be read before either.
PRIMARY_TABLE_PROPERTIES = {**TABLE_PROPERTIES, "delta.deletedFileRetentionDuration": "interval 5 minutes"}


def spark_ddl(schema: pa.Schema) -> str:
    """The schema as a Spark SQL column list, for tables Spark creates."""
    def sql_type(t: pa.DataType) -> str:
        if pa.types.is_map(t):
            return f"MAP<{sql_type(t.key_type)}, {sql_type(t.item_type)}>"
        if pa.types.is_list(t):
            return f"ARRAY<{sql_type(t.value_type)}>"
        return {pa.string(): "STRING", pa.binary(): "BINARY", pa.int64(): "BIGINT",
                TIMESTAMP: "TIMESTAMP"}[t]
    return ", ".join(f"`{f.name}` {sql_type(f.type)}{'' if f.nullable else ' NOT NULL'}" for f in schema)


def join(base: str, *parts: str) -> str:
    """Join path parts for a local path or a URI (no os.sep on object stores)."""
    if "://" in base:
        return "/".join([base.rstrip("/"), *parts])
    return os.path.join(base, *parts)


def absolute(data_dir: str) -> str:
    return data_dir if "://" in data_dir else os.path.abspath(data_dir)


@dataclass(frozen=True)
class PartitionPaths:
    data_dir: str
    partition: int

    @property
    def root(self) -> str:
        return join(absolute(self.data_dir), f"partition-{self.partition:03d}")

    @property
    def puts(self) -> str:
        return join(self.root, "puts")

    @property
    def lease(self) -> str:
        return join(self.root, "lease")

    @property
    def delivery(self) -> str:
        return join(self.root, "delivery")

    @property
    def confirms(self) -> str:
        return join(self.root, "confirms")

    @property
    def dead_letters(self) -> str:
        return join(self.root, "dead_letters")

    @property
    def disagreements(self) -> str:
        return join(self.root, "disagreements")

    @property
    def dedup_checkpoint(self) -> str:
        return join(absolute(self.data_dir), "_checkpoints", f"dedup-{self.partition:03d}")



def local_checkpoint(checkpoint: str) -> str | None:
    """A Spark checkpoint's local directory; None for an object store."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return None
    return checkpoint.removeprefix("file:")


def stream_offset(checkpoint: str, batch_id: int) -> dict[str, Any]:
    """The Delta source's end offset for micro-batch `batch_id` in a local
    Spark checkpoint's offset log (written before the batch runs):
    reservoirVersion, index, isStartingVersion. Raises OSError or ValueError
    if it is missing or not in the format understood."""
    root = local_checkpoint(checkpoint)
    if root is None:
        raise OSError(f"{checkpoint}: not a local checkpoint")
    with open(os.path.join(root, "offsets", str(batch_id)), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    if len(lines) < 3:
        raise ValueError(f"offset log entry {batch_id} has no source offset")
    offset = json.loads(lines[2])
    if not isinstance(offset, dict) or not isinstance(offset.get("reservoirVersion"), int):
        raise ValueError(f"offset log entry {batch_id}: no reservoirVersion")
    return offset


def stream_resume_version(checkpoint: str) -> int | None:
    """The oldest version of its Delta source a Spark stream would read if it
    restarted now: the start of the last micro-batch of its offset log (the
    end offset of the batch before it), or for batch 0 its starting version.

    Not the end of the last committed batch: on a restart Spark hands the
    last batch's offsets to a V1 source again (`getBatch(start, end)`, as
    Kafka's source needs), committed or not, and the Delta source then wants
    every commit from `start` on (DELTA_MISSING_FILES_UNEXPECTED_VERSION
    otherwise: a stream that cannot restart). None when that cannot be known
    (no checkpoint yet, an object-store path, an entry not understood):
    nothing may then be assumed."""
    root = local_checkpoint(checkpoint)
    if root is None:
        return None
    try:
        planned = sorted(int(n) for n in os.listdir(os.path.join(root, "offsets")) if n.isdigit())
    except OSError:
        return None
    if not planned:
        return None
    latest = planned[-1]
    batch = latest - 1 if latest - 1 in planned else planned[0]
    try:
        return int(stream_offset(checkpoint, batch)["reservoirVersion"])
    except (OSError, ValueError):
        return None
