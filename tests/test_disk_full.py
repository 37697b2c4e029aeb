"""The disk under a partition's tables fills up (a real tmpfs of a few MiB,
filled by a file of our own) while a producer posts: every PUT still gets
exactly one ACK, failures come back as STORAGE_FAILURE within seconds, the
node stays up, the tables stay readable, and once space returns the same
node takes PUTs again and delivers everything it ACKed, also after a
restart. Needs the right to mount a tmpfs (root or CAP_SYS_ADMIN); skipped,
with the reason, where that is refused."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import collect

from storage import tables

pytestmark = [pytest.mark.integration]

URI = "taproot://demo/disk-full"
SIZE = "24m"
FULL_FOR_S = 6.0


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    """Take every free byte of the file system under `directory`."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    f.write(block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return filler


def outcomes(futures: list) -> list:
    """(guid, error or None) for each PUT, each answered within 60 s."""
    results = []
    for future in futures:
        try:
            future.result(timeout=60)
            results.append((future.guid, None))
        except Exception as exc:
            results.append((future.guid, exc))
    return results


def post(queue, count: int, tag: bytes) -> list:
    return outcomes([queue.post(tag + b"%05d" % i + b"x" * 1000) for i in range(count)])


def test_a_full_disk_refuses_puts_with_storage_failure_and_recovers_when_space_returns(tmp_path):
    from taproot import AckError, ResultCode, Session
    from taproot_ops.embedded import EmbeddedCluster
    data = tmp_path / "data"
    conf_file = Path(__file__).resolve().parent / "cluster_conf" / "cluster.toml"
    with tmpfs(Path(tables.PartitionPaths(str(data), 0).root), SIZE) as disk, \
            EmbeddedCluster(str(conf_file), data_dir=str(data), ephemeral_ports=True, with_pipeline=False,
                            with_proxy=False) as cluster:
        node = cluster.config.nodes[0].name
        with Session([cluster.node_address]) as session:
            producer = session.open_queue(URI, write=True)
            before = post(producer, 300, b"before")
            assert all(e is None for _, e in before), [e for _, e in before if e][:3]

            # Full for longer than a lease (2 s), so the lease renewals fail
            # too and the node steps down; a producer posts all the while.
            filler = fill(disk)
            futures: list = []
            started = time.monotonic()
            while time.monotonic() - started < FULL_FOR_S:
                futures += [producer.post(b"during%05d" % i + b"x" * 1000) for i in range(50)]
                time.sleep(0.2)
            filler.unlink()
            during = outcomes(futures)
            answered_in = time.monotonic() - started
            errors = [e for _, e in during if e is not None]
            assert errors, "nothing was refused although the disk was full"
            assert all(isinstance(e, AckError) and e.code == ResultCode.STORAGE_FAILURE for e in errors), \
                {repr(e) for e in errors if not (isinstance(e, AckError) and e.code == ResultCode.STORAGE_FAILURE)}
            print(f"\ndisk full for {FULL_FOR_S:.0f} s: {len(errors)} of {len(during)} PUTs refused STORAGE_FAILURE, "
                  f"the rest stored; all answered {answered_in:.1f} s after the disk filled")

            after = post(producer, 300, b"after")
            assert all(e is None for _, e in after), [e for _, e in after if e][:3]
            assert cluster.processes[node].popen.poll() is None, "the node died"

            acked = {g for g, e in before + during + after if e is None}
            consumer = session.open_queue(URI, read=True)
            got = {m.guid for m in collect(consumer, len(acked), timeout_s=60)}
            assert acked <= got, f"{len(acked - got)} ACKed messages not delivered"
            consumer.close()

        # The tables are whole: delta-rs reads them, and a restarted node
        # recovers the partition and serves it.
        from deltalake import DeltaTable
        stored = set(DeltaTable(tables.PartitionPaths(str(data), 0).puts).to_pyarrow_table(
            columns=["guid"])["guid"].to_pylist())
        assert acked <= stored
        cluster.restart_node(name=node)
        with Session([cluster.node_address]) as session:
            producer = session.open_queue(URI, write=True)
            assert all(e is None for _, e in post(producer, 50, b"restart"))
            consumer = session.open_queue(URI, read=True)
            again = collect(consumer, 60, timeout_s=10)
            assert {m.payload[:7] for m in again} == {b"restart"}, "confirmed messages came back after a restart"
        assert os.path.ismount(disk)
