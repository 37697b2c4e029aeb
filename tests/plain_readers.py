"""Open Taproot's tables with plain Spark, delta-rs and DuckDB, importing no
Taproot code (the test checks sys.modules at the end). Prints one JSON object.

    python tests/plain_readers.py <data_dir> <ivy_jars_dir>
"""

import glob
import json
import os
import sys

data_dir, jars_dir = sys.argv[1], sys.argv[2]
tables = ["puts", "delivery", "confirms", "dead_letters", "disagreements"]
paths = {t: os.path.join(data_dir, "partition-000", t) for t in tables}
out: dict = {}

# delta-rs
from deltalake import DeltaTable  # noqa: E402

out["deltars"] = {t: DeltaTable(p).to_pyarrow_table().num_rows for t, p in paths.items()}
# Time travel and the change feed on the delivery log: the PUT and confirm
# logs keep only their latest versions (their writer trims their logs).
delivery = DeltaTable(paths["delivery"])
out["deltars_time_travel_v0"] = DeltaTable(paths["delivery"], version=0).to_pyarrow_table().num_rows
cdf = delivery.load_cdf(starting_version=0)
import pyarrow as pa  # noqa: E402

out["deltars_cdf_inserts"] = pa.RecordBatchReader.from_stream(cdf).read_all().num_rows

# DuckDB with the delta extension (from the duckdb-extension-delta wheel: no download)
import duckdb  # noqa: E402
import duckdb_extension_delta  # noqa: E402

ext = glob.glob(os.path.join(duckdb_extension_delta.__path__[0], "extensions", "*", "delta.duckdb_extension"))[0]
con = duckdb.connect()
con.load_extension(ext)
out["duckdb"] = {t: con.sql(f"SELECT count(*) FROM delta_scan('{p}')").fetchone()[0] for t, p in paths.items()}
# The delivery log routes; payloads and properties are in the PUT log, joined on seq.
out["duckdb_eu"] = con.sql(f"SELECT count(*) FROM delta_scan('{paths['delivery']}') d "
                           f"JOIN delta_scan('{paths['puts']}') p ON d.seq = p.seq "
                           "WHERE p.properties['region'] = 'EU'").fetchone()[0]

# Spark with Delta, configured the plain way (the jars Delta's pip package names, from a local cache)
from pyspark.sql import SparkSession  # noqa: E402

jars = ",".join(sorted(glob.glob(os.path.join(jars_dir, "io.delta_*.jar"))))  # delta-spark, delta-storage
spark = (SparkSession.builder.master("local[1]").appName("plain-reader")
         .config("spark.jars", jars)
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.ui.enabled", "false")
         # The suite's JIT setting (tests/conftest.py), read from the environment, not from Taproot's code.
         .config("spark.driver.extraJavaOptions", os.environ.get("TAPROOT_JVM_OPTIONS", ""))
         # Delta's public setting for small local sessions: rebuilding a table's
         # state with its default 50 tasks cost 40 of this script's 65 s on 2 cores.
         .config("spark.databricks.delta.snapshotPartitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out["spark"] = {t: spark.read.format("delta").load(p).count() for t, p in paths.items()}
out["spark_time_travel_v0"] = spark.read.format("delta").option("versionAsOf", 0).load(paths["delivery"]).count()
out["spark_cdf_inserts"] = (spark.read.format("delta").option("readChangeFeed", "true")
                            .option("startingVersion", 0).load(paths["delivery"])
                            .where("_change_type = 'insert'").count())
spark.stop()
out["taproot_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in
                                ("taproot", "storage", "primary", "pipelines", "protocol", "conf", "proxies",
                                 "replicas"))
print(json.dumps(out))
