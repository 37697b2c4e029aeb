"""Queues as tables: Spark SQL views over Taproot's Delta tables.

    from storage.views import register_views
    register_views(spark, "data")           # any SparkSession with Delta configured
    spark.sql("SELECT * FROM taproot_backlog").show()

Views (temporary views of the given session, or with `persistent` of its catalog;
each is a union over the partitions):

- `taproot_puts`: the raw PUT logs, one row per accepted PUT (retransmissions
  included). A row exists as soon as its ACK has been sent.
- `taproot_messages`: one row per message (first PUT of each GUID), with
  `guid_hex`, each message property as a column of its own (typed when every
  message agrees on the type, else text), and `delivered_time` once the
  pipeline has delivered it. Fresh at ACK time, like `taproot_puts`.
- `taproot_delivery`, `taproot_confirms`, `taproot_dead_letters`: the tables.
  The delivery log identifies and routes (partition, seq, guid, apps, times);
  join it to `taproot_puts` on (partition, seq) for payloads and properties.
  Every table view has a `partition` column.
- `taproot_disagreements`: messages the primary's express lane and the
  pipeline (the authority) decided differently: a duplicate one side kept, or
  other apps. Empty while they agree.
- `taproot_backlog`: per domain, queue and app: messages delivered, confirmed,
  dead-lettered, and the backlog (delivered minus confirmed minus dead-lettered),
  with the oldest waiting message's put time.
- `taproot_latency`: per message and app: put, delivered and confirm times,
  and the delivery and confirm latency in milliseconds.
- `taproot_rates`: per domain, queue and minute: PUTs, deliveries and confirms.

Tables that do not exist yet (no dead letters so far) read as empty.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

import pyarrow as pa

from protocol.expression import sql_string
from storage import tables
from storage.property_kinds import PropertyKinds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


VIEWS = ("taproot_puts", "taproot_messages", "taproot_delivery", "taproot_confirms", "taproot_dead_letters",
         "taproot_disagreements", "taproot_backlog", "taproot_latency", "taproot_rates")

_SQL_TYPES = {"int32": "BIGINT", "int64": "BIGINT", "bool": "BOOLEAN", "string": "STRING"}


def partitions_of(data_dir: str) -> list[int]:
    """The partitions present in a local data directory."""
    found = sorted(int(os.path.basename(p).split("-")[1])
                   for p in glob.glob(os.path.join(tables.absolute(data_dir), "partition-[0-9][0-9][0-9]")))
    return found or [0]


def _union_sql(spark: "SparkSession", paths: list[tuple[int, str]], schema: pa.Schema) -> str:
    """SQL reading the latest version of each table on every query (a view over
    `delta.`path`` is not pinned to a snapshot), with its partition number.
    Columns an older table lacks read as NULL; a table not created yet
    contributes no rows."""
    from pyspark.errors import AnalysisException

    selects = []
    fields = [f for f in schema if f.name != "partition"]
    for partition, path in paths:
        try:
            present = set(spark.read.format("delta").load(path).columns)
        except AnalysisException:
            continue  # not created yet
        cols = [_quote(f.name) if f.name in present else f"CAST(NULL AS {_sql_type(f)}) AS {_quote(f.name)}"
                for f in fields]
        selects.append(f"SELECT CAST({partition} AS BIGINT) AS `partition`, {', '.join(cols)} FROM delta.`{path}`")
    if not selects:
        nulls = ", ".join(f"CAST(NULL AS {_sql_type(f)}) AS {_quote(f.name)}" for f in fields)
        return f"SELECT CAST(NULL AS BIGINT) AS `partition`, {nulls} WHERE FALSE"
    return " UNION ALL ".join(selects)


def _sql_type(f: pa.Field) -> str:
    return tables.spark_ddl(pa.schema([f.with_nullable(True)])).split(" ", 1)[1]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"



# `taproot_backlog`, over `taproot__targets` (a row per delivery and app),
# `taproot_confirms` and `taproot_dead_letters`. One pass over the three,
# grouped twice (by message and app, then by queue and app), rather than a
# join of each with the targets: two shuffles, not four, which is most of a
# warm query's time once Delta has listed the tables' files (issue 22 in
# docs/benchmarks.md). A target counts once per delivery row: as confirmed if
# its app confirmed it, else as dead-lettered if it was, else as waiting;
# confirms and dead letters of nothing delivered count nowhere.
BACKLOG_SQL = """
    SELECT domain, queue, app_id,
           sum(n) AS delivered,
           sum(CASE WHEN c = 1 THEN n ELSE 0 END) AS confirmed,
           sum(CASE WHEN c = 0 AND x = 1 THEN n ELSE 0 END) AS dead_lettered,
           sum(CASE WHEN c = 0 AND x = 0 THEN n ELSE 0 END) AS backlog,
           min(CASE WHEN c = 0 AND x = 0 THEN put_time END) AS oldest_waiting_put_time
    FROM (SELECT guid, app_id, max(domain) AS domain, max(queue) AS queue, sum(d) AS n,
                 max(c) AS c, max(x) AS x, min(put_time) AS put_time
          FROM (SELECT guid, app_id, domain, queue, put_time, 1 AS d, 0 AS c, 0 AS x FROM taproot__targets
                UNION ALL SELECT guid, app_id, NULL, NULL, NULL, 0, 1, 0 FROM taproot_confirms
                UNION ALL SELECT guid, app_id, NULL, NULL, NULL, 0, 0, 1 FROM taproot_dead_letters)
          GROUP BY guid, app_id)
    WHERE n > 0
    GROUP BY domain, queue, app_id"""


def register_views(spark: "SparkSession", data_dir: str = "data", partitions: list[int] | None = None,
                   persistent: bool = False, properties: PropertyKinds | None = None) -> list[str]:
    """Register every Taproot view on `spark`; returns their names. With
    `persistent`, as views of the session catalog, which every session of
    the same Spark application sees (the Spark Connect endpoint's sessions:
    `pipelines/runner.py`); otherwise as temporary views of `spark` alone.
    `properties`: what a caller that registers again keeps between
    registrations, so that only new data files are read for property names."""
    kind = "VIEW" if persistent else "TEMP VIEW"
    # Which tables these views read: `taproot sql` checks it before it uses a running endpoint's views.
    served = sql_string(tables.absolute(data_dir))
    spark.sql(f"CREATE OR REPLACE {kind} taproot__cluster AS SELECT {served} AS data_dir")
    parts = [tables.PartitionPaths(data_dir, i) for i in (partitions or partitions_of(data_dir))]
    for name, attr, schema in (("taproot_puts", "puts", tables.PUTS_SCHEMA),
                               ("taproot_delivery", "delivery", tables.DELIVERY_SCHEMA),
                               ("taproot_confirms", "confirms", tables.CONFIRMS_SCHEMA),
                               ("taproot_dead_letters", "dead_letters", tables.DEAD_LETTERS_SCHEMA),
                               ("taproot_disagreements", "disagreements", tables.DISAGREEMENTS_SCHEMA)):
        union = _union_sql(spark, [(p.partition, getattr(p, attr)) for p in parts], schema)
        spark.sql(f"CREATE OR REPLACE {kind} {name} AS {union}")

    # Properties as columns: one per property name; typed when all messages agree.
    kinds = (properties or PropertyKinds()).read([p.puts for p in parts])
    base = {f.name for f in tables.PUTS_SCHEMA} | {"partition", "guid_hex", "delivered_time", "apps"}
    columns = []
    for key in sorted(kinds):
        name = key if key not in base else f"property_{key}"
        value = f"p.properties[{sql_string(key)}]"
        types = kinds[key]
        if len(types) == 1 and next(iter(types)) in _SQL_TYPES:
            value = f"TRY_CAST({value} AS {_SQL_TYPES[next(iter(types))]})"
        elif types == {"binary"}:
            value = f"unbase64({value})"
        columns.append(f"{value} AS {_quote(name)}")
    extra = "".join(f", {c}" for c in columns)
    spark.sql(f"""CREATE OR REPLACE {kind} taproot_messages AS
        SELECT p.partition, p.domain, p.queue, upper(hex(p.guid)) AS guid_hex, p.guid, p.seq, p.payload,
               p.compression, p.properties, p.property_types, p.producer_time, p.put_time{extra},
               d.delivered_time, d.apps
        FROM (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY guid ORDER BY seq) AS _n
                             FROM taproot_puts) WHERE _n = 1) p
        LEFT JOIN (SELECT partition, guid, min(delivered_time) AS delivered_time, first(apps) AS apps
                   FROM taproot_delivery GROUP BY partition, guid) d
               ON p.partition = d.partition AND p.guid = d.guid""")

    spark.sql(f"""CREATE OR REPLACE {kind} taproot__targets AS
        SELECT domain, queue, guid, seq, put_time, delivered_time, explode(coalesce(apps, array(''))) AS app_id
        FROM taproot_delivery""")
    spark.sql(f"CREATE OR REPLACE {kind} taproot_backlog AS {BACKLOG_SQL}")
    spark.sql(f"""CREATE OR REPLACE {kind} taproot_latency AS
        SELECT t.domain, t.queue, t.app_id, t.guid, t.seq, t.put_time, t.delivered_time, c.confirm_time,
               (unix_micros(t.delivered_time) - unix_micros(t.put_time)) / 1000.0 AS delivery_ms,
               (unix_micros(c.confirm_time) - unix_micros(t.put_time)) / 1000.0 AS confirm_ms
        FROM taproot__targets t
        LEFT JOIN (SELECT guid, app_id, min(confirm_time) AS confirm_time FROM taproot_confirms
                   GROUP BY guid, app_id) c ON t.guid = c.guid AND t.app_id = c.app_id""")
    spark.sql(f"""CREATE OR REPLACE {kind} taproot_rates AS
        SELECT coalesce(p.domain, d.domain, c.domain) AS domain, coalesce(p.queue, d.queue, c.queue) AS queue,
               coalesce(p.minute, d.minute, c.minute) AS minute,
               coalesce(p.n, 0) AS puts, coalesce(d.n, 0) AS delivered, coalesce(c.n, 0) AS confirms
        FROM (SELECT domain, queue, date_trunc('MINUTE', put_time) AS minute, count(*) AS n
              FROM taproot_puts GROUP BY ALL) p
        FULL OUTER JOIN (SELECT domain, queue, date_trunc('MINUTE', delivered_time) AS minute, count(*) AS n
                         FROM taproot_delivery GROUP BY ALL) d
             ON p.domain = d.domain AND p.queue = d.queue AND p.minute = d.minute
        FULL OUTER JOIN (SELECT domain, queue, date_trunc('MINUTE', confirm_time) AS minute, count(*) AS n
                         FROM taproot_confirms GROUP BY ALL) c
             ON coalesce(p.domain, d.domain) = c.domain AND coalesce(p.queue, d.queue) = c.queue
            AND coalesce(p.minute, d.minute) = c.minute""")
    return list(VIEWS)
