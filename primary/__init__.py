"""The primary role: root of a storage partition.

Owns: group commits of PUT batches to the partition's raw PUT Delta table
(delta-rs) with an ACK per PUT after the commit; CONFIRMs into the confirm
table; routing of delivery-log rows to consumers (`dispatcher.py`, a pure state
machine); redelivery of a departed consumer's unconfirmed messages.

Imports: conf, protocol, replicas, storage.
Never: pyspark, delta, taproot.
Pure: dispatcher, express.
"""
