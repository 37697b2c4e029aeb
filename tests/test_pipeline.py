"""Spark tier: the pipeline's transforms and its exactly-once write."""

from __future__ import annotations

import datetime as dt

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from pipelines.dedup import to_delivery_rows, write_delivery_batch
from pipelines.runner import create_delivery_table
from storage.tables import DELIVERY_SCHEMA, PUTS_SCHEMA, spark_ddl

pytestmark = pytest.mark.spark


def puts_df(spark, guids, domain="d", props=lambda i: ({}, {})):
    now = dt.datetime.now(dt.timezone.utc)
    rows = [(domain, "q", g, i, b"p", *props(i), now, now, 1, None) for i, g in enumerate(guids)]
    return spark.createDataFrame(rows, spark_ddl(PUTS_SCHEMA).replace(" NOT NULL", ""))


def test_delivery_rows_keep_put_columns_and_add_batch_columns(spark):
    out = to_delivery_rows(puts_df(spark, [b"a" * 16]), 7)
    assert out.columns == [f.name for f in DELIVERY_SCHEMA]
    assert out.select("batch_id").first()[0] == 7


def test_replayed_batch_adds_no_duplicates(spark, tmp_path):
    path = str(tmp_path / "delivery")
    create_delivery_table(spark, path)
    batch = puts_df(spark, [bytes([i]) * 16 for i in range(5)])
    write_delivery_batch(batch, 0, path, "app-1")
    write_delivery_batch(batch, 0, path, "app-1")  # Spark replays batch 0 after a crash
    table = spark.read.format("delta").load(path)
    assert table.count() == 5
    write_delivery_batch(puts_df(spark, [b"z" * 16]), 1, path, "app-1")
    expected = spark.createDataFrame([(bytes([i]) * 16,) for i in range(5)] + [(b"z" * 16,)], "guid binary")
    assert_df_equality(table.select("guid").orderBy("guid"), expected.orderBy("guid"), ignore_nullable=True)
    assert spark.read.format("delta").load(path).filter(F.col("batch_id") == 1).count() == 1


def test_fanout_targets_apps_by_their_subscriptions_in_spark_sql(spark):
    from conf import parse_domain

    domains = {"f": parse_domain("f", {"mode": "fanout", "app_ids": ["all", "eu", "big"], "subscriptions": {
        "eu": "region = 'EU'", "big": "amount > 100"}}),
        "p": parse_domain("p", {"subscriptions": {"": "exists(keep)"}})}

    def props(i):
        region, amount = ("EU", 500) if i == 0 else ("US", 5) if i == 1 else ("EU", "lots")
        return ({"region": region, "amount": str(amount)},
                {"region": "string", "amount": "int32" if isinstance(amount, int) else "string"})

    fan = to_delivery_rows(puts_df(spark, [bytes([i]) * 16 for i in range(3)], "f", props), 0, domains)
    assert [sorted(r.apps) for r in fan.orderBy("seq").collect()] == [["all", "big", "eu"], ["all"], ["all", "eu"]]
    prio = to_delivery_rows(puts_df(spark, [b"k" * 16, b"n" * 16], "p", lambda i: (
        ({"keep": "1"}, {"keep": "int32"}) if i == 0 else ({}, {}))), 0, domains)
    assert [r.apps for r in prio.orderBy("seq").collect()] == [[""], []]   # [] = auto-confirmed
    other = to_delivery_rows(puts_df(spark, [b"o" * 16], "unknown"), 0, domains)
    assert other.first().apps == [""]


def test_delivery_table_from_an_older_release_gains_the_new_columns(spark, tmp_path):
    path = str(tmp_path / "old")
    old_columns = [f for f in DELIVERY_SCHEMA if f.name not in ("apps", "compression")]
    import pyarrow as pa
    spark.sql(f"CREATE TABLE delta.`{path}` ({spark_ddl(pa.schema(old_columns))}) USING DELTA")
    create_delivery_table(spark, path)
    assert set(spark.read.format("delta").load(path).columns) == {f.name for f in DELIVERY_SCHEMA}
    write_delivery_batch(puts_df(spark, [b"a" * 16]), 0, path, "app-1")
    assert spark.read.format("delta").load(path).first().apps == [""]
