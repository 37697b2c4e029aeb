"""Taproot's tools: what runs and measures a cluster, apart from the SDK.

`cli.py` is the `taproot` command; `embedded.py` runs a cluster (nodes, proxy,
pipeline) as processes on one machine; `demo.py` is `taproot run`'s traffic;
`loadgen.py` is the load generator; `bench/` is `taproot bench` (Taproot, and
RabbitMQ and NATS for comparison). `pip install taproot` ships this package
but the server roles it starts need the `server` extra.

Imports: conf, pipelines, primary, protocol, proxies, replicas, storage, taproot.
"""
