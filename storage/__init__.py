"""Storage: where every table lives, its schema, and who writes it.

`tables.py` defines paths and schemas once; `deltars.py` is the delta-rs access
the primary uses for the tables it owns; `spark.py` builds Spark sessions with
Delta's jars (fetched once from Maven Central into the project's cache).
Paths may be local or object-store URIs. The views render subscriptions with
the protocol's expression language.

`leases.py` holds the primaries' leases and fencing in Delta commits;
`lease_machine.py` is the pure state machine they follow.

Imports: protocol.
Pure: lease_machine.
"""
