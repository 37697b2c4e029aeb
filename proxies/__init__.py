"""The proxy role: the edge node clients connect to.

Thin: one upstream session to a node shared by every client session, with the
frame rewriting of `replicas.relay.Relay`. If the upstream link drops, every
PUT in flight is answered UNKNOWN and client sessions are closed so they
reconnect.

Imports: conf, protocol, replicas.
Never: pyspark, delta, deltalake, taproot.
"""
