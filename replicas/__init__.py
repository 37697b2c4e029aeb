"""The replica role: what a node does for the partitions it does not lead,
and what every forwarding hop shares.

`relay.py` is the forwarding logic (id mapping, the retransmission buffer,
reopen and resend after failover), pure; `upstream.py` is its thread and gRPC
shell, one upstream session shared by many downstream links (proxies run one,
nodes one per partition led elsewhere).

Imports: conf, protocol.
Never: pyspark, delta, deltalake, taproot.
Pure: relay.
"""
