"""The primary role: a cluster node, root of the partitions it leads.

- `node.py`: the frames of every link, handled by job (the node process's core);
- `leadership.py`: leases, failover, recovery and stepping down;
- `admission.py`: whether an open, configure or PUT is taken (pure);
- `partition.py`: one led partition: group commits of PUT batches to its PUT
  Delta table (delta-rs) with an ACK per PUT after the commit, CONFIRMs into
  the confirm table, the express lane and its reconciliation with the
  pipeline's delivery log, recovery after a takeover;
- `dispatcher.py`: routing to consumers, flow control, redelivery (pure);
- `express.py`: the GUID history and the express decisions (pure);
- `group_commit.py`, `compaction.py`, `quota.py`: the commit batcher, the
  tables' background compaction, the domains' quotas;
- `server.py`: the gRPC server and `taproot node stop`.

Imports: conf, protocol, replicas, storage.
Never: pyspark, delta, taproot.
Pure: admission, dispatcher, express.
"""
