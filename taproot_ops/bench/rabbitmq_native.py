"""RabbitMQ at its best, for comparison (issue 20, RabbitMQ's part):
Debian's rabbitmq-server (installed if missing, started on loopback as
`taproot bench --compare` starts it), driven by RabbitMQ's Java PerfTest
(`com.rabbitmq:perf-test` from Maven Central, fetched once with Maven into
`.cache/perf-test-<version>`).

    python -m taproot_ops.bench.rabbitmq_native [--seconds 20] [--json out.json]
    taproot bench --system rabbitmq-native

Every run: 1 KiB persistent messages on quorum queues (RabbitMQ fsyncs the
Raft log before it confirms), publisher confirms with 1,000 in flight,
consumers with manual acks and a prefetch of 1,000:

- `1 queue`: one producer and one consumer, full speed, for `--seconds`;
- `10 queues`: ten of each, one queue each;
- `fanout to 5`: one producer to a fanout exchange bound to five quorum
  queues, one consumer each;
- `10k msg/s`: the producer paced at 10,000 a second.

PerfTest reports the confirm latency (PUT->ACK) and the consumer latency
(publish to delivery: PUT->PUSH) percentiles. The broker's CPU (its
process tree, from /proc) is reported per published message.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from taproot_ops.bench.cpu import tree_cpu_seconds
from taproot_ops.bench.native import FANOUT, ONE_QUEUE, PACED, TEN_QUEUES, line, maven_jars
from taproot_ops.bench.native import main as native_main

VERSION = "2.22.1"   # 2.23.0 and 2.24.0 did not resolve from Maven Central here


def jars() -> Path:
    return maven_jars("perf-test", VERSION, [("com.rabbitmq", "perf-test", VERSION)], f"perf-test-{VERSION}.jar")


_RATE = re.compile(r"(sending|receiving) rate avg: ([\d.]+) msg/s")
_LATENCY = re.compile(r"(consumer|confirm) latency min/median/75th/95th/99th ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)/"
                      r"([\d.]+) (µs|ms)")


def parse_summary(text: str) -> dict[str, Any]:
    """PerfTest's end-of-run summary: send and receive rates, and the confirm
    (PUT->ACK) and consumer (PUT->PUSH) latency percentiles, in ms."""
    rates = {kind: float(value) for kind, value in _RATE.findall(text)}
    if "sending" not in rates:
        raise RuntimeError(f"no summary from PerfTest: {text[-500:]}")
    latency: dict[str, dict[str, float]] = {}
    for kind, _min, median, _p75, _p95, p99, unit in _LATENCY.findall(text):
        scale = 1 / 1000 if unit == "µs" else 1.0
        latency[kind] = {"p50": float(median) * scale, "p99": float(p99) * scale}
    return {"produce_msg_s": rates["sending"], "consume_msg_s": rates.get("receiving"),
            "ack_ms": latency.get("confirm"), "push_ms": latency.get("consumer")}


def perf_test(address: str, seconds: float, *extra: str) -> dict[str, Any]:
    command = ["java", "-Xmx1g", "-cp", f"{jars()}/*", "com.rabbitmq.perf.PerfTest",
               "--uri", f"amqp://guest:guest@{address}", "--size", "1024", "--flag", "persistent",
               "--confirm", "1000", "--qos", "1000", "--quorum-queue", "--auto-delete", "false",
               "--time", str(int(seconds)), *extra]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    if out.returncode != 0:
        raise RuntimeError(f"PerfTest failed ({out.returncode}): {(out.stdout + out.stderr)[-500:]}")
    return parse_summary(out.stdout + out.stderr)


def _broker_pid(address: str) -> int | None:
    """The Erlang VM listening on `address`'s port (its process tree is the broker)."""
    port = address.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    found = re.search(r"pid=(\d+)", out.stdout)
    return int(found.group(1)) if found else None


def run_all(seconds: float,
            runs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every run, appended to `runs` as it ends (a caller keeps those done if a later one fails)."""
    from taproot_ops.bench import peers

    peers.ensure_installed("rabbitmq")
    runs = [] if runs is None else runs
    with peers.server("rabbitmq") as address:
        pid = _broker_pid(address)
        shapes: list[tuple[str, str, list[str]]] = [
            (ONE_QUEUE, "1 queue", ["--producers", "1", "--consumers", "1", "--queue", "q1"]),
            (TEN_QUEUES, "10 queues", ["--producers", "10", "--consumers", "10", "--queue-pattern", "q10-%d",
                           "--queue-pattern-from", "1", "--queue-pattern-to", "10"]),
            (FANOUT, "fanout exchange, 5 queues", [
                "--producers", "1", "--consumers", "5", "--exchange", "fan", "--type", "fanout", "--queue-pattern",
                "f5-%d", "--queue-pattern-from", "1", "--queue-pattern-to", "5", "--producer-random-start-delay", "0"]),
            (PACED, "10k msg/s", ["--producers", "1", "--consumers", "1", "--queue", "q10k", "--rate", "10000"]),
        ]
        for scenario, label, args in shapes:
            cpu = tree_cpu_seconds({"broker": pid}).get("broker", 0.0) if pid is not None else None
            result = perf_test(address, seconds, *args)
            if pid is not None and cpu is not None:
                used = tree_cpu_seconds({"broker": pid}).get("broker", 0.0) - cpu
                result["server_cpu_us_per_msg"] = used * 1e6 / max(1.0, result["produce_msg_s"] * seconds)
            runs.append({"system": "rabbitmq", "scenario": scenario, "label": label,
                         "durability": "quorum queues (fsync before confirm)", **result})
            print(line("rabbitmq", runs[-1]), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seconds", type=float, default=20.0, help="seconds per run")
    return native_main(argv, __doc__, "rabbitmq", arguments, lambda args: run_all(args.seconds),
                       {"perf-test": VERSION})


if __name__ == "__main__":
    sys.exit(main())
