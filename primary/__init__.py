"""The primary role: a cluster node, root of the partitions it leads.

- `node.py`: the frames of every link, handled by job (the node process's core);
- `leadership.py`: leases, failover, recovery and stepping down;
- `admission.py`: whether an open, configure or PUT is taken (pure);
- `partition.py`: one led partition: group commits of PUT batches to its PUT
  Delta table (delta-rs) with an ACK per PUT after the commit, CONFIRMs into
  the confirm table, the express lane and its reconciliation with the
  pipeline's delivery log, recovery after a takeover;
- `dispatcher.py`: routing to consumers, flow control, redelivery (pure);
  `held.py`: a consumer's unconfirmed rows, a run's as one span (pure);
- `express.py`: the GUID history and the express decisions (pure);
- `group_commit.py`, `compaction.py`, `quota.py`: the commit batcher, the
  tables' background compaction, the domains' quotas;
- `links.py`: federation links, the sending side: each partition's PUT log
  forwarded to another cluster (docs/federation.md);
- `server.py`: the gRPC server and `taproot node stop`.

`links.py` alone uses the SDK: a link is a producer on the other cluster, and
the SDK's retransmission buffer, reconnection and flow control are what it
needs there.

Imports: conf, protocol, replicas, storage, taproot (links.py only).
Never: pyspark, delta.
Pure: admission, dispatcher, express, held.
"""
