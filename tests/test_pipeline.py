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


def puts_df(spark, guids):
    now = dt.datetime.now(dt.timezone.utc)
    rows = [("d", "q", g, i, b"p", {}, {}, now, now, 1) for i, g in enumerate(guids)]
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
