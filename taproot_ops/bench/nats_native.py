"""NATS JetStream at its best, for comparison (issue 20, NATS's part): a
current nats-server and natscli (`nats bench`), both built once from the Go
module proxy into the tools directory SeaweedFS uses
(`~/.cache/taproot/tools`), the server started on loopback with file
storage.

    python -m taproot_ops.bench.nats_native [--messages 1000000] [--json out.json]
    taproot bench --system nats-native

Every run is 1 KiB messages on one file-backed stream, one replica:

- `1 stream`: `nats bench js pub async` (publisher acknowledgements, 500
  in flight), then `nats bench js consume` (a durable pull consumer,
  explicit acks) reading them all;
- `fanout, 5 consumers`: the same stream read at once by five durable
  consumers (each its own `nats bench` process), every message to each;
- `10k msg/s`: `nats bench js pub sync` paced at 10,000 a second (each
  publish waits for its acknowledgement: PUT->ACK per message). `nats
  bench` has no end-to-end latency: PUT->PUSH is not measured;
- durability: JetStream's default acknowledges once the message is
  written to the stream's file and fsyncs every 2 minutes
  (`sync_interval`); `fsync` runs the server with `sync_interval: always`.

The server's CPU (its process, from /proc) is reported per published
message, its deliveries included.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from taproot_ops.bench.cpu import tree_cpu_seconds
from taproot_ops.bench.native import PeerUnavailable, full_speed, line, stop
from taproot_ops.bench.native import main as native_main
from taproot_ops.embedded import free_port

SERVER = ("github.com/nats-io/nats-server/v2", "v2.15.2", "nats-server")
CLI = ("github.com/nats-io/natscli/nats", "v0.5.0", "nats")


def tools_dir() -> Path:
    return Path(os.environ.get("TAPROOT_TOOLS_DIR") or Path.home() / ".cache" / "taproot" / "tools")


def binary(tool: tuple[str, str, str]) -> Path:
    """The tool built once with `go install module@version` (a path naming the version)."""
    module, version, name = tool
    target = tools_dir() / f"{name}-{version}"
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise PeerUnavailable(f"building {name} needs the Go toolchain (`go`) on the PATH")
    print(f"building {name} {version} from the Go module proxy (once, about a minute) ...", flush=True)
    with tempfile.TemporaryDirectory() as gobin:
        out = subprocess.run(["go", "install", f"{module}@{version}"], capture_output=True, text=True,
                             env=dict(os.environ, GOBIN=gobin), timeout=1800)
        if out.returncode != 0:
            raise PeerUnavailable(f"building {name} failed: " + " ".join(out.stderr.strip().splitlines()[-3:]))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(gobin) / name), target)
    return target


class Server:
    def __init__(self, fsync: bool):
        self.binary = binary(SERVER)
        self.nats = binary(CLI)
        self.fsync = fsync
        self.work = Path(tempfile.mkdtemp(prefix="taproot-bench-nats-"))
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> None:
        config = self.work / "nats.conf"
        config.write_text(f'listen: "127.0.0.1:{self.port}"\njetstream {{\n  store_dir: "{self.work / "js"}"\n'
                          + ("  sync_interval: always\n" if self.fsync else "") + "}\n")
        log = open(self.work / "server.log", "wb")
        self.process = subprocess.Popen([str(self.binary), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}; see {log.name}")
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.cli("server", "check", "jetstream")
                return
            time.sleep(0.3)
        raise RuntimeError(f"nats-server did not answer within {timeout_s:.0f} s")

    def cli(self, *args: str, timeout_s: float = 900) -> str:
        out = subprocess.run([str(self.nats), *args, "-s", self.url], capture_output=True, text=True,
                             timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"nats {' '.join(args[:3])} failed: " + " ".join(
                (out.stdout + out.stderr).strip().splitlines()[-2:]))
        return out.stdout + out.stderr

    def cpu_s(self) -> float:
        assert self.process is not None
        return tree_cpu_seconds({"server": self.process.pid}).get("server", 0.0)

    def stop(self) -> None:
        stop(self.process, self.work)


@contextlib.contextmanager
def server(fsync: bool = False) -> Iterator[Server]:
    s = Server(fsync)
    try:
        s.start()
        yield s
    finally:
        s.stop()


_STATS = re.compile(r"stats: ([\d,]+) msgs/sec")
_PERCENTILE = re.compile(r"P(50|99): ([\d,.]+)us")


def parse_stats(text: str) -> dict[str, Any]:
    """`nats bench`'s stats line: msgs/sec, and for publishers the ack latency percentiles (ms)."""
    found = _STATS.search(text)
    if found is None:
        raise RuntimeError(f"no stats from nats bench: {text[-500:]}")
    latency = {f"p{q}": float(v.replace(",", "")) / 1000 for q, v in _PERCENTILE.findall(text)}
    return {"msg_s": float(found.group(1).replace(",", "")), "ack_ms": latency or None}


def publish(s: Server, stream: str, messages: int, sync: bool = False, rate: int = 0) -> dict[str, Any]:
    args = ["bench", "js", "pub", "sync" if sync else "async", f"{stream}.x", "--stream", stream, "--create",
            "--storage", "file", "--msgs", str(messages), "--size", "1KB", "--no-progress", "--maxbytes", "4GB"]
    if rate:
        args += ["--throughput", str(rate)]
    return parse_stats(s.cli(*args))


def consume(s: Server, stream: str, messages: int, consumer: str) -> subprocess.Popen[str]:
    s.cli("consumer", "add", stream, consumer, "--pull", "--deliver", "all", "--ack", "explicit", "--defaults")
    return subprocess.Popen([str(s.nats), "bench", "js", "consume", "--stream", stream, "--consumer", consumer,
                             "--msgs", str(messages), "--size", "1KB", "--no-progress", "-s", s.url],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def consumed(process: subprocess.Popen[str]) -> float:
    text, _ = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"nats bench js consume failed: {text[-500:]}")
    return float(parse_stats(text)["msg_s"])


def run_all(messages: int, paced_s: float) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for fsync in (False, True):
        durability = "fsync every write (sync_interval: always)" if fsync else "default (fsync every 2 min)"
        with server(fsync=fsync) as s:
            for label, readers in (("1 queue", 1), ("fanout to 5", 5)):
                if fsync and readers > 1:
                    continue
                stream = f"s{len(runs)}"
                runs.append(full_speed("nats", label, durability, messages, s.cpu_s,
                                       functools.partial(publish, s, stream, messages),
                                       [functools.partial(consume, s, stream, messages, f"c{i}")
                                        for i in range(readers)],
                                       consumed))
            if not fsync:
                published = publish(s, "paced", int(10_000 * paced_s), sync=True, rate=10_000)
                runs.append({"system": "nats", "label": "10k msg/s", "durability": durability,
                             "produce_msg_s": published["msg_s"], "consume_msg_s": None,
                             "ack_ms": published["ack_ms"], "push_ms": None, "server_cpu_us_per_msg": None})
                print(line("nats", runs[-1]), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--messages", type=int, default=1_000_000, help="messages per full-speed run (1 KiB)")
        parser.add_argument("--paced", type=float, default=20.0, help="seconds of the 10k msg/s run")
    return native_main(argv, __doc__, "nats", arguments, lambda args: run_all(args.messages, args.paced),
                       {"nats-server": SERVER[1], "natscli": CLI[1]})


if __name__ == "__main__":
    sys.exit(main())
