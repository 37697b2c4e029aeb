"""Kafka at its best, for comparison (issue 20, Kafka's part): a KRaft
broker (one node, broker and controller) of a current 4.x release, from
Maven Central's jars, started on loopback, driven by Kafka's own load
tools (`ProducerPerformance`, `ConsumerPerformance`, `EndToEndLatency`, the
classes behind `kafka-producer-perf-test.sh` and friends) and, for latency
under load, by `drivers/PacedLatency.java` on Kafka's Java client.

    python -m taproot_ops.bench.kafka [--records 1000000] [--fsync-records 250000] [--paced 20] [--json out.json]
    taproot bench --system kafka

The jars are fetched once with Maven into `.cache/kafka-<version>/jars`
(Maven Central is reachable where Delta's jars come from). Every run is
1 KiB records, `acks=all` (the producer's acknowledgement once the record
is in the partition leader's log, which here is the only replica):

- `1 topic`: one producer at full speed, then one consumer group reading
  them all;
- `10 topics`: ten producers at once (the tool writes one topic: ten
  JVMs), a tenth of the records each, then ten consumers at once;
- `1 topic, 10 partitions`: one producer and one consumer over a topic of
  10 partitions (Kafka's unit of parallelism);
- `5 consumer groups`: produced once, then five consumer groups reading
  it at once (each its own JVM);
- `10k msg/s`: the paced driver, 10,000 records a second for 5 s of
  warm-up and `--paced` seconds measured, PUT->ACK (send to
  acknowledgement) and PUT->PUSH (send to the consumer's poll) of each;
- `1 record at a time`: `EndToEndLatency`, produce one record, consume
  it, repeat (unloaded PUT->PUSH);
- durability: Kafka's default acknowledges before any fsync (the OS
  flushes; replication is the durability, and there is one replica here);
  the second pass runs the broker with `log.flush.interval.messages=1` (a
  flush for every append) for comparison with Taproot's fsynced commits,
  every run but the unloaded one, `--fsync-records` per full-speed run.

The broker's CPU (its process, from /proc) is reported per produced record,
its deliveries to every group included (as Taproot's server CPU per
message). Several tools at once (`native.together`): their rate is their
messages over the union of their windows, their ack latency the worst of
their percentiles.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from taproot_ops.bench.cpu import tree_cpu_seconds
from taproot_ops.bench.native import (
    FANOUT,
    ONE_QUEUE,
    PACED,
    TEN_QUEUES,
    Tool,
    full_speed,
    line,
    maven_jars,
    paced_result,
    paced_run,
    stop,
)
from taproot_ops.bench.native import main as native_main
from taproot_ops.embedded import free_port

VERSION = "4.2.0"
SCALA = "2.13"
RECORD_BYTES = 1024


def jars() -> Path:
    """The directory of Kafka's jars, fetched with Maven once."""
    return maven_jars("kafka", VERSION, [("org.apache.kafka", f"kafka_{SCALA}", VERSION),
                                         ("org.apache.kafka", "kafka-tools", VERSION),
                                         ("org.slf4j", "slf4j-nop", "1.7.36")], f"kafka-tools-{VERSION}.jar")


def _java(jar_dir: Path, main: str, *args: str, heap: str = "512m") -> list[str]:
    return ["java", f"-Xmx{heap}", "-cp", f"{jar_dir}/*", main, *args]


def _run(command: list[str], timeout_s: float) -> str:
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"{command[4]} failed ({out.returncode}): " + " ".join(text.strip().splitlines()[-3:]))
    return text


class Broker:
    def __init__(self, jar_dir: Path, fsync: bool):
        self.jar_dir = jar_dir
        self.fsync = fsync
        self.work = Path(tempfile.mkdtemp(prefix="taproot-bench-kafka-"))
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> None:
        config = self.work / "server.properties"
        config.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            f"log.dirs={self.work / 'logs'}", "num.partitions=1",
            "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1", "group.initial.rebalance.delay.ms=0",
            *(["log.flush.interval.messages=1"] if self.fsync else []), ""]))
        _run(_java(self.jar_dir, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config)), 120)
        log = open(self.work / "broker.log", "wb")
        self.process = subprocess.Popen(_java(self.jar_dir, "kafka.Kafka", str(config), heap="1g"),
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.process.returncode}; see {log.name}")
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _run(_java(self.jar_dir, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap,
                           "--list", heap="128m"), 30)
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Kafka broker did not answer within {timeout_s:.0f} s")

    def cpu_s(self) -> float:
        assert self.process is not None
        return tree_cpu_seconds({"broker": self.process.pid}).get("broker", 0.0)

    def topic(self, name: str, partitions: int = 1) -> str:
        _run(_java(self.jar_dir, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", self.bootstrap,
                   "--create", "--topic", name, "--partitions", str(partitions), "--replication-factor", "1",
                   heap="128m"), 60)
        return name

    def stop(self) -> None:
        stop(self.process, self.work)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@contextlib.contextmanager
def broker(fsync: bool = False) -> Iterator[Broker]:
    b = Broker(jars(), fsync)
    try:
        b.start()
        yield b
    finally:
        b.stop()


_PRODUCED = re.compile(r"(\d+) records sent, ([\d.]+) records/sec .*?, ([\d.]+) ms avg latency, ([\d.]+) ms max "
                       r"latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th")


def producer(b: Broker, topic: str, records: int) -> list[str]:
    """`ProducerPerformance` at full speed (`parse_produced` reads it)."""
    return _java(b.jar_dir, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                 "--num-records", str(records), "--record-size", str(RECORD_BYTES), "--throughput", "-1",
                 "--producer-props", f"bootstrap.servers={b.bootstrap}", "acks=all", heap="512m")


def parse_produced(text: str) -> Tool:
    """ProducerPerformance's last summary line: records, msg/s, ack latency (ms)."""
    match = _PRODUCED.findall(text)
    if not match:
        raise RuntimeError(f"no summary from ProducerPerformance: {text[-500:]}")
    sent, per_s, _avg, peak, p50, _p95, p99 = match[-1]
    return Tool(int(sent), float(per_s), {"p50": float(p50), "p99": float(p99), "max": float(peak)})


def consumer(b: Broker, topic: str, records: int, group: str) -> list[str]:
    """`ConsumerPerformance` reading `records` as `group` (`parse_consumed` reads it)."""
    return _java(b.jar_dir, "org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", b.bootstrap,
                 "--topic", topic, "--num-records", str(records), "--group", group, "--timeout", "60000",
                 heap="512m")


def parse_consumed(text: str) -> Tool:
    """ConsumerPerformance's CSV row: messages and nMsg.sec (first fetch to last, rebalance included)."""
    header = next((line.split(", ") for line in text.splitlines() if line.startswith("start.time")), None)
    rows = [line.split(", ") for line in text.splitlines() if re.match(r"^\d{4}-\d\d-\d\d ", line)]
    if header is None or not rows:
        raise RuntimeError(f"no result from ConsumerPerformance: {text[-500:]}")
    return Tool(int(rows[-1][header.index("data.consumed.in.nMsg")]), float(rows[-1][header.index("nMsg.sec")]))


def end_to_end(b: Broker, topic: str, records: int = 5000) -> dict[str, float]:
    """`EndToEndLatency`: one record at a time, produced then consumed: ms."""
    text = _run(_java(b.jar_dir, "org.apache.kafka.tools.EndToEndLatency", "--bootstrap-server", b.bootstrap,
                      "--topic", topic, "--num-records", str(records), "--producer-acks", "all",
                      "--record-size", str(RECORD_BYTES), heap="512m"), timeout_s=600)
    return parse_end_to_end(text)


def parse_end_to_end(text: str) -> dict[str, float]:
    """EndToEndLatency's percentiles (ms)."""
    found = re.search(r"Percentiles: 50th = ([\d.]+), 99th = ([\d.]+)", text)
    if found is None:
        raise RuntimeError(f"no percentiles from EndToEndLatency: {text[-500:]}")
    return {"p50": float(found.group(1)), "p99": float(found.group(2))}


DRIVER = Path(__file__).resolve().parent / "drivers" / "PacedLatency.java"


def paced(b: Broker, topic: str, rate: float, seconds: float, warmup_s: float = 5) -> dict[str, Any]:
    """`drivers/PacedLatency.java` (Kafka's Java client, run from source):
    `rate` records a second for `warmup_s` (not measured) and `seconds`,
    PUT->ACK and PUT->PUSH of each."""
    return paced_result(_run(_java(b.jar_dir, str(DRIVER), b.bootstrap, topic, str(rate), str(seconds),
                                   str(RECORD_BYTES), str(warmup_s), heap="1g"), timeout_s=seconds + warmup_s + 300))


def run_all(records: int, fsync_records: int, paced_s: float,
            runs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every run, appended to `runs` as it ends (a caller keeps those done if a later one fails)."""
    runs = [] if runs is None else runs
    for fsync in (False, True):
        durability = "fsync every append" if fsync else "default (acks=all, OS flush)"
        count = fsync_records if fsync else records
        with broker(fsync=fsync) as b:
            for scenario, label, topics, partitions, groups in (
                    (ONE_QUEUE, "1 topic", 1, 1, 1), (TEN_QUEUES, "10 topics", 10, 1, 1),
                    (TEN_QUEUES, "1 topic, 10 partitions", 1, 10, 1), (FANOUT, "5 consumer groups", 1, 1, 5)):
                names = [b.topic(f"t{len(runs)}-{i}", partitions) for i in range(topics)]
                each = count // topics
                runs.append(full_speed(
                    "kafka", scenario, label, durability, b.cpu_s,
                    [producer(b, topic, each) for topic in names], parse_produced,
                    [consumer(b, names[i % topics], each, f"g{i}") for i in range(max(topics, groups))],
                    parse_consumed))
            runs.append(paced_run("kafka", "10k msg/s", durability, b.cpu_s,
                                  functools.partial(paced, b, b.topic("paced"), 10_000, paced_s)))
            if not fsync:
                latency = end_to_end(b, b.topic("e2e"))
                runs.append({"system": "kafka", "scenario": PACED, "label": "1 record at a time",
                             "durability": durability, "produce_msg_s": None, "consume_msg_s": None, "ack_ms": None,
                             "push_ms": {**latency, "note": "EndToEndLatency: produce one, consume it, repeat"},
                             "server_cpu_us_per_msg": None})
                print(line("kafka", runs[-1]), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--records", type=int, default=1_000_000, help="records per full-speed run (1 KiB each)")
        parser.add_argument("--fsync-records", type=int, default=250_000,
                            help="records per full-speed run with fsync on every append")
        parser.add_argument("--paced", type=float, default=20.0, help="seconds of the 10k msg/s run")
    return native_main(argv, __doc__, "kafka", arguments,
                       lambda args: run_all(args.records, args.fsync_records, args.paced), {"kafka": VERSION})


if __name__ == "__main__":
    sys.exit(main())
