"""Spark session factory: Delta's jars, the RocksDB state store, local mode.

Delta's jars come from Maven Central the first time (Spark's Ivy resolver,
`spark.jars.packages`) into a cache the project owns (`$TAPROOT_CACHE_DIR`,
default `<repo>/.cache`). Later sessions load the cached jar files directly
through `spark.jars`, so they start without touching the network.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_SPARK_VERSION = "4.4.0"  # the newest delta-spark_4.2_2.13 jar on Maven Central
DELTA_PACKAGE = f"io.delta:delta-spark_4.2_2.13:{DELTA_SPARK_VERSION}"
LOG4J2_FILE = Path(__file__).resolve().parent / "log4j2.properties"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Which Delta connector a session reads tables with: STRICT, the Kernel-based one
# (it lists a table's files in the driver, not with a Spark job; Delta calls the
# mode a testing mode: DESCRIBE HISTORY and DELETE fail in it); AUTO, the
# default, the classic one for path tables; NONE, the classic one always.
DELTA_CONNECTOR_MODE = "spark.databricks.delta.v2.enableMode"

# More options for every Spark JVM Taproot starts: drivers, executors and a
# standalone cluster's daemons (`taproot_ops.spark_standalone`). The test
# suite sets `-XX:TieredStopAtLevel=1` (C1 only): its JVMs live seconds to
# minutes, and C2's compilations were about 40 % of their CPU (docs/benchmarks.md).
JVM_OPTIONS_ENV = "TAPROOT_JVM_OPTIONS"
# Netty 4.2 (Spark's RPC and Spark Connect's gRPC server) emits JFR events
# from its buffer allocators; the first one sets up JFR's metadata in the
# thread that happens to reallocate a buffer. Once, in the test suite's CI
# run (2026-11-29), that set-up failed in the pipeline's Connect endpoint:
# "Could not initialize class io.netty.buffer.ReallocateBufferEvent" from then
# on, every answer with large headers (an error's) broke the HTTP/2 stream, and
# a pyspark client retried it for minutes. Taproot records no JFR: off.
NETTY_JFR_OFF = "-Dio.netty.jfr.enabled=false"


def jvm_options() -> str:
    """Options for every Spark JVM Taproot starts: `NETTY_JFR_OFF`, then
    $TAPROOT_JVM_OPTIONS (which may set it back)."""
    return f"{NETTY_JFR_OFF} {os.environ.get(JVM_OPTIONS_ENV, '')}".strip()


def cache_dir() -> Path:
    env = os.environ.get("TAPROOT_CACHE_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / ".cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def hadoop_version() -> str:
    """The Hadoop client pyspark ships (hadoop-aws must match it)."""
    import pyspark
    [api] = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return api.name[len("hadoop-client-api-"):-len(".jar")]


def _ivy_dir(object_store: bool) -> Path:
    """Delta's jars; with an object store, Delta's and hadoop-aws's (with the
    AWS SDK bundle, about 690 MB), in a cache of their own so local sessions
    never load them."""
    return cache_dir() / ("ivy-s3" if object_store else "ivy")


def _packages(object_store: bool) -> list[str]:
    return [DELTA_PACKAGE] + ([f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"] if object_store else [])


def _cached_jars(object_store: bool = False) -> list[Path]:
    jars_dir = _ivy_dir(object_store) / "jars"
    if not jars_dir.is_dir():
        return []
    jars = sorted(jars_dir.glob("*.jar"))
    names = " ".join(j.name for j in jars)
    # The resolver puts delta-spark and its runtime dependencies here; anything
    # less means an interrupted download: resolve again.
    if f"delta-spark_4.2_2.13-{DELTA_SPARK_VERSION}.jar" not in names or "delta-storage" not in names:
        return []
    if object_store and not ("hadoop-aws-" in names and "bundle-" in names):
        return []
    # Ivy also resolves older copies of libraries that Spark ships newer
    # (hadoop-client, parquet, log4j, jackson...). Loading both invites
    # class-version clashes, so keep only the artifacts Spark lacks.
    import pyspark
    spark_jars = Path(pyspark.__file__).parent / "jars"
    shipped = {_artifact(j.name) for j in spark_jars.glob("*.jar")}
    return [j for j in jars if _artifact(j.name.split("_", 1)[-1]) not in shipped]


def _artifact(jar_name: str) -> str:
    """`parquet-column-1.16.0.jar` -> `parquet-column`."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar_name)


def submitted() -> bool:
    """Launched by spark-submit (its JVM started this Python and says where
    to reach it): its --master, --conf and --packages are in force."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(app_name: str = "taproot", *, master: str = "local[*]", driver_host: str = "127.0.0.1",
            shuffle_partitions: int = 2, extra_conf: dict[str, str] | None = None,
            object_store: bool = False) -> "SparkSession":
    """Return a SparkSession with Delta Lake enabled.

    `master`: "local[*]", or a cluster's ("spark://host:7077"), whose
    executors reach this driver at `driver_host` (`[pipeline]` in
    cluster.toml: `PipelineConfig.spark_options`). Under spark-submit
    neither is set here: its own settings are in force.

    `object_store`: the tables are on S3 (`conf.spark_options`): hadoop-aws
    is loaded too.

    `shuffle_partitions` is fixed per streaming checkpoint (Spark refuses to change
    it once a checkpoint exists), so pipelines pass the value from the cluster conf.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", driver_host)  # loopback only, unless told otherwise
    from pyspark.sql import SparkSession

    jvm = jvm_options()
    builder = SparkSession.builder
    if not submitted():
        builder = (builder.master(master)
                   .config("spark.driver.bindAddress", driver_host)
                   .config("spark.driver.host", driver_host))
    builder = (
        builder
        .appName(app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Counting the state's rows costs a RocksDB read before every write:
        # the dedup took 22.3-24.7 µs of JVM CPU a row without it, 25.8-30.5
        # with (`taproot bench --pipeline 600000 --batch 10000`, alternated,
        # docs/benchmarks.md). The pipeline counts its GUIDs itself
        # (`pipelines.runner.DedupState`); Spark reports numRowsTotal 0.
        .config("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # Timestamps as Parquet INT64 microseconds, not INT96 (nanoseconds to
        # pyarrow and duckdb, which overflow outside 1677-2262): every reader
        # of the tables gets the values the primary wrote.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_FILE} {jvm}".strip())
        .config("spark.databricks.delta.properties.defaults.checkpointInterval", "10")
        # Delta rebuilds table state with this many tasks (default 50); in local
        # mode on a few cores that alone cost seconds per micro-batch (measured:
        # 7 s -> 1.7 s per dedup batch on 2 cores).
        .config("spark.databricks.delta.snapshotPartitions", str(max(1, shuffle_partitions)))
        # No empty micro-batches just to advance the watermark: each one would be
        # a Delta commit and a checkpoint write for nothing.
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # VACUUM lists a table's files with this many tasks; Spark's default
        # (10,000) made one VACUUM of a small delivery log take 64 s on 2 cores.
        .config("spark.databricks.delta.vacuum.fileListing.parallelism", str(max(2, shuffle_partitions)))
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", str(max(2, shuffle_partitions)))
    )
    if os.environ.get(JVM_OPTIONS_ENV) or not submitted():   # a spark-submit --conf of them stays in force
        builder = builder.config("spark.executor.extraJavaOptions", jvm)
    jars = _cached_jars(object_store)
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    else:
        builder = builder.config("spark.jars.packages", ",".join(_packages(object_store))).config(
            "spark.jars.ivy", str(_ivy_dir(object_store)))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# A call is retried 4 times, 50 ms x 4 each time up to 2 s between: about
# 3 s. A `taproot replay --remote` on an endpoint that stays UNAVAILABLE
# said so after 12 s here (a query is two calls; closing waits up to 10 s
# for PySpark's releases of what it ran).
CONNECT_RETRIES, CONNECT_MAX_BACKOFF_MS = 4, 2000


@contextlib.contextmanager
def remote_session(url: str) -> Iterator["SparkSession"]:
    """A Spark Connect session on `url` (sc://host:port: the pipeline's
    endpoint), stopped after, leaving the process free to start a local
    session: PySpark marks the process as a Connect client
    (SPARK_CONNECT_MODE_ENABLED) when a remote session starts, and would
    refuse a local one while the mark stays."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    # The caller says what failed (`unavailable`); PySpark's own warning would only add a line.
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    remote = SparkSession.builder.remote(url).getOrCreate()
    # PySpark retries an endpoint that answers UNAVAILABLE 15 times, backing
    # off to a minute: about 7 minutes before a caller hears of it. A blip
    # passes in a moment; an endpoint that stays broken is an error.
    remote.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES, max_backoff=CONNECT_MAX_BACKOFF_MS)])
    try:
        yield remote
    finally:
        # Releasing the session is tried once: a broken endpoint has had its retries.
        remote.client.set_retry_policies([DefaultPolicy(max_retries=0)])
        with contextlib.suppress(Exception):
            remote.stop()
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def unavailable(exc: BaseException) -> str | None:
    """What a Spark Connect endpoint that cannot serve said, as
    "UNAVAILABLE: <details>", when `exc` is PySpark's error for that (its
    text is gRPC's description of the call); None for any other error."""
    text = str(exc)
    code = re.search(r"StatusCode\.(UNAVAILABLE|DEADLINE_EXCEEDED)", text)
    if code is None:
        return None
    details = re.search(r'details = "(.*)"', text)
    return f"{code.group(1)}: {details.group(1) if details else 'no details'}"


FETCH_ATTEMPTS = 3


def fetch_jars(object_store: bool = False) -> bool:
    """Fetch Delta's jars (and with `object_store` hadoop-aws's) into the
    cache once, with a throwaway local session; True if it had to. A
    resolution that fails (Maven Central answered badly once: the JVM exits
    before Spark starts) is tried again, resuming from Ivy's cache."""
    if _cached_jars(object_store):
        return False
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            spark = session("taproot-setup", object_store=object_store)
        except Exception as exc:       # pyspark's JAVA_GATEWAY_EXITED, whose cause Ivy printed above
            if attempt == FETCH_ATTEMPTS:
                raise
            print(f"fetching the jars failed ({type(exc).__name__}); trying again "
                  f"({attempt + 1} of {FETCH_ATTEMPTS})", flush=True)
            time.sleep(5 * attempt)
            continue
        spark.range(1).count()
        spark.stop()
        return True
    raise AssertionError("unreachable")


def main() -> None:
    """`python -m storage.spark [--object-store]`: fetch Delta's jars once
    (`make setup`); with --object-store hadoop-aws's too (`make test`: the
    hosts tier's pipeline runs where Maven Central cannot be reached)."""
    object_store = "--object-store" in sys.argv[1:]
    jars = _ivy_dir(object_store) / "jars"
    what = "delta and hadoop-aws jars" if object_store else "delta jars"
    if not _cached_jars(object_store):
        print(f"fetching {what} from Maven Central into {jars} (once)", flush=True)
    fetched = fetch_jars(object_store)
    print(f"{what} {'fetched into' if fetched else 'cached in'} {jars}")


if __name__ == "__main__":
    main()
