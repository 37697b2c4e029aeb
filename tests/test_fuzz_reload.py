"""Fuzz tier, a running cluster's reload: while a producer posts through
the proxy, a domain file is rewritten again and again with mutated, random
and valid-but-odd contents (and turned into a directory, a symlink loop,
bytes that are not UTF-8). Every role stays up with no traceback in its log
(a bad file is logged and the last good domains stay), and afterwards a new
valid domain is taken by the node and by the pipeline, which records its
messages.

`VARIANTS` files by default (seeded); `pytest --long` writes 20 times as many.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest
from conftest import collect, wait_until
from fuzzing import mutate

import conf
from protocol.uri import QueueUri, partition_of
from storage import tables

pytestmark = [pytest.mark.integration, pytest.mark.spark]

VARIANTS = 12
POLL_S = 1.1     # a little over the node's domain poll (primary/node.py DOMAIN_POLL_S)
SAMPLES = sorted((Path(__file__).resolve().parent / "cluster_conf" / "domains").glob("*.toml"))


def valid_but_odd(rng: random.Random) -> str:
    mode = rng.choice(["priority", "fanout", "broadcast"])
    lines = [f'mode = "{mode}"']
    if mode == "fanout":
        lines.append(f'app_ids = {rng.choice([["a"], ["a", "b"], ["x" * 64]])!r}'.replace("'", '"'))
    if mode != "broadcast":
        lines.append(f"max_payload_bytes = {rng.choice([1, 1024, 64 * 1024 * 1024])}")
        lines.append(f'delivery = "{rng.choice(["express", "pipeline"])}"')
    return "\n".join(lines) + "\n"


def write_variant(rng: random.Random, path: Path) -> str:
    """Replace `path` with one odd thing; say what."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        path.rmdir()
    kind = rng.choice(["mutated", "mutated", "mutated", "random", "valid", "valid", "not-utf8", "directory",
                       "symlink-loop", "empty"])
    if kind == "mutated":
        path.write_bytes(mutate(rng, rng.choice(SAMPLES).read_bytes()))
    elif kind == "random":
        path.write_bytes(rng.randbytes(rng.choice([1, 50, 500])))
    elif kind == "valid":
        path.write_text(valid_but_odd(rng))
    elif kind == "not-utf8":
        path.write_bytes(b'mode = "\xff\xfe"\n')
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-loop":
        os.symlink(path.name, path)
    else:
        path.write_bytes(b"")
    return kind


def log_since(process, offset: int) -> str:
    with open(process.log_file, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def test_a_running_cluster_survives_any_domain_file_and_takes_the_next_good_one(cluster, request):
    domains = Path(cluster.config_path).parent / "domains"
    count = VARIANTS * (20 if request.config.getoption("--long") else 1)
    rng = random.Random(int(os.environ.get("TAPROOT_FUZZ_SEED", "20261123")))
    watched = {name: p for name, p in cluster.processes.items()}
    offsets = {name: p.log_file.stat().st_size for name, p in watched.items()}
    target = domains / "fuzzed.toml"
    from taproot import Session
    kinds: dict[str, int] = {}
    with Session([cluster.client_address]) as session:
        producer = session.open_queue("taproot://demo/during-reload-fuzz", write=True)
        try:
            for _ in range(count):
                kind = write_variant(rng, target)
                kinds[kind] = kinds.get(kind, 0) + 1
                for future in [producer.post(b"m") for _ in range(20)]:  # pipeline batches meanwhile
                    future.result(timeout=30)
                time.sleep(POLL_S)
        finally:
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
    print(f"\n{count} domain files: {kinds}")
    for name, process in watched.items():
        assert process.popen.poll() is None, f"{name} exited with {process.popen.returncode}"
        text = log_since(process, offsets[name])
        assert "Traceback" not in text, f"{name}'s log:\n{text[text.index('Traceback') - 1500:][:5000]}"

    # The next good domain is taken by the node (an open succeeds) and by the
    # pipeline (its messages reach the delivery log).
    (domains / "fuzzok.toml").write_text('mode = "priority"\n')
    try:
        uri = "taproot://fuzzok/q"

        def opens() -> bool:
            try:
                with Session([cluster.client_address]) as s, s.open_queue(uri, write=True, timeout_s=5):
                    return True
            except Exception:
                return False

        wait_until(opens, 30, interval_s=0.5, what="the node to take the new domain")
        with Session([cluster.client_address]) as session:
            producer = session.open_queue(uri, write=True)
            futures = [producer.post(b"ok") for _ in range(20)]
            for future in futures:
                future.result(timeout=30)
            guids = {f.guid for f in futures}
            consumer = session.open_queue(uri, read=True)
            assert {m.guid for m in collect(consumer, 20, timeout_s=30)} == guids
        path = tables.PartitionPaths(cluster.data_dir, partition_of(QueueUri("fuzzok", "q"),
                                                                    cluster.config.partitions)).delivery

        def recorded() -> bool:
            from deltalake import DeltaTable
            rows = DeltaTable(path).to_pyarrow_table(columns=["domain", "guid"]).to_pylist()
            return guids <= {r["guid"] for r in rows if r["domain"] == "fuzzok"}

        wait_until(recorded, 120, interval_s=1, what="the pipeline to record the new domain's messages")
    finally:
        (domains / "fuzzok.toml").unlink()
        assert "fuzzok" not in conf.load_domains(domains)
