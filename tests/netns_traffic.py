"""The client host of `tests/test_hosts.py`: run in a network namespace of
its own (`ip netns exec`), where the tree's proxy and the object store are
reachable and the test's own namespace is not. The object store's settings
and credentials come in the environment (`SeaweedFS.use_in_this_process`
in the test's process).

    netns_traffic.py traffic --hosts H:P --uri U --data-dir D --partitions N --control DIR [--graceful]
        One producer and one consumer (`test_faults.Traffic`: 10,000 PUTs at
        5,000/s). Writes DIR/progress.json as it goes; once the test writes
        DIR/fault.json ({"at": monotonic s, "wall_us": µs}, after injecting
        its fault) checks the fault suite's invariants, waits until the
        pipeline's delivery log (the authority) has every message, and
        writes DIR/result.json.
    netns_traffic.py leases --data-dir D --partitions N
        Prints each partition's lease ({"holder", "epoch", "address"}) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage import deltars, tables  # noqa: E402
from storage.leases import LeaseTable  # noqa: E402

AUTHORITY_TIMEOUT_S = 240


def write_json(path: Path, value: object) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)


def leases(data_dir: str, partitions: int) -> list[dict]:
    out = []
    for p in range(partitions):
        view = LeaseTable(tables.PartitionPaths(data_dir, p).lease).read()
        out.append({} if view is None else {"holder": view.holder, "epoch": view.epoch, "address": view.address,
                                            "released": view.released})
    return out


def decided(data_dir: str, partition: int, guids: set[bytes]) -> int:
    """How many of `guids` have their row in the partition's delivery log."""
    table = deltars.try_open(tables.PartitionPaths(data_dir, partition).delivery)
    if table is None:
        return 0
    return len(guids & set(table.to_pyarrow_table(columns=["guid"])["guid"].to_pylist()))


def traffic(args: argparse.Namespace) -> None:
    import test_faults as faults

    from protocol.uri import parse_queue_uri, partition_of

    control = Path(args.control)
    result: dict = {"ok": False}
    run = faults.Traffic(args.hosts, args.uri)
    done = threading.Event()

    def report() -> None:
        while not done.is_set():
            write_json(control / "progress.json", {"posted": run.posted, "acked": len(run.acks),
                                                   "received": len(run.received)})
            done.wait(0.1)

    threading.Thread(target=report, daemon=True).start()
    try:
        fault_file = control / "fault.json"
        deadline = time.monotonic() + 600
        while not fault_file.exists():
            if time.monotonic() > deadline:
                raise AssertionError("the test never said its fault was over")
            time.sleep(0.05)
        fault = json.loads(fault_file.read_text())
        run.posted_at_fault_end = run.posted
        outage = run.check(args.graceful, fault["at"])
        duplicates = run.duplicates()
        tree = SimpleNamespace(data_dir=args.data_dir, config=SimpleNamespace(partitions=args.partitions))
        undone = faults.confirmed_before(tree, args.uri, duplicates, fault["wall_us"])
        assert not undone, (f"{len(undone)} messages delivered again although their CONFIRM was committed "
                            "before the fault")
        # The authority: the pipeline on the Spark cluster decided every message.
        partition = partition_of(parse_queue_uri(args.uri), args.partitions)
        wanted = set(run.put_order)
        started = time.monotonic()
        while (have := decided(args.data_dir, partition, wanted)) < len(wanted):
            assert time.monotonic() - started < AUTHORITY_TIMEOUT_S, \
                f"the pipeline decided {have} of {len(wanted)} messages within {AUTHORITY_TIMEOUT_S} s"
            time.sleep(1)
        times = sorted(t for t, _, _ in run.acks)
        result = {"ok": True, "outage_s": outage, "acked_before_fault": sum(t < fault["at"] for t in times),
                  "first_ack_s": round(times[0] - fault["at"], 3), "last_ack_s": round(times[-1] - fault["at"], 3),
                  "puts": len(run.acks), "delivered": len(set(run.received)),
                  "duplicates": len(duplicates), "authority_wait_s": round(time.monotonic() - started, 1),
                  "events": sorted({type(e).__name__ for e in run.events})}
    except AssertionError as exc:
        result = {"ok": False, "error": str(exc)}
    finally:
        done.set()
        run.close()
        write_json(control / "result.json", result)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["traffic", "leases"])
    p.add_argument("--hosts", nargs="+")
    p.add_argument("--uri")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--control")
    p.add_argument("--graceful", action="store_true")
    args = p.parse_args()
    if args.what == "leases":
        print(json.dumps(leases(args.data_dir, args.partitions)))
    else:
        traffic(args)
    # The answer is out (stdout, or result.json): end here. At interpreter
    # exit this process sometimes aborted ("terminate called without an
    # active exception", SIGABRT) in native threads of the Delta/Arrow
    # readers it used against the store, after its work was done.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
