"""The replica role: a cluster node in the middle of the tree.

Now: `relay.py`, the forwarding logic every hop shares (proxies use it today).
A replica relays PUTs up and PUSHes down and stands by for a partition's
primary role; leases, standby and per-link fan-out land with the HA work.
May import: conf, protocol, storage.
"""
