"""Storage: where every table lives, its schema, and who writes it.

`tables.py` defines paths and schemas once; `deltars.py` is the delta-rs access
the primary uses for the tables it owns; `spark.py` builds Spark sessions with
Delta's jars (fetched once from Maven Central into the project's cache).
Imports nothing else from Taproot. Paths may be local or object-store URIs.
"""
