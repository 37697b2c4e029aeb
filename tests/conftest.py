"""Shared fixtures. Tiers: `unit` (no JVM, no sockets), `integration` (real
processes on loopback, real Delta), `spark` (a JVM). Unmarked tests default to unit."""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# PySpark logs each failed query's whole plan as one JSON line; the exception says it all.
logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)


def pytest_collection_modifyitems(items):
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("integration", "spark")):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (with Delta) for every Spark-tier test; started on first use."""
    from storage import spark as spark_factory
    session = spark_factory.session("taproot-tests")
    yield session
    session.stop()


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.05, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
