"""Spark Structured Streaming jobs (pyspark + delta-spark).

Owns: the dedup pipeline (raw PUT log -> delivery log, exactly once, GUID
history in RocksDB state). Writes only Spark-owned tables (the delivery log);
reads delta-rs-owned ones. Transforms are pure `DataFrame -> DataFrame`
functions; the stream wiring is separate. Replay posts a queue's history back
through the SDK, as any producer would.

Imports: conf, protocol, storage, taproot.
"""
