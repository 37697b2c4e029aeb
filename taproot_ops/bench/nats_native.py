"""NATS JetStream at its best, for comparison (issue 20, NATS's part): a
current nats-server and natscli (`nats bench`), both built once from the Go
module proxy into the tools directory SeaweedFS uses
(`~/.cache/taproot/tools`), the server started on loopback with file
storage; for latency under load, `drivers/natspaced` (nats.go), built there
too.

    python -m taproot_ops.bench.nats_native [--messages 1000000] [--fsync-messages 100000] [--paced 20]
    taproot bench --system nats-native

Every run is 1 KiB messages on file-backed streams, one replica:

- `1 stream`: `nats bench js pub async` (publisher acknowledgements, 500
  in flight), then `nats bench js consume` (a durable pull consumer,
  explicit acks) reading them all;
- `10 streams`: ten publishers at once, a tenth of the messages each to
  its own stream, then ten consumers at once;
- `5 consumers`: one stream read at once by five durable consumers (each
  its own `nats bench` process), every message to each;
- `10k msg/s`: the paced driver, asynchronous publishes (500 in flight at
  most) at 10,000 a second for 5 s of warm-up and `--paced` seconds
  measured, PUT->ACK and PUT->PUSH of each (`nats bench` has no end-to-end
  latency);
- durability: JetStream's default acknowledges once the message is
  written to the stream's file and fsyncs every 2 minutes
  (`sync_interval`); the second pass runs the server with `sync_interval:
  always`, `--fsync-messages` per full-speed run.

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
from typing import Any, Callable, Iterator

from taproot_ops.bench.cpu import tree_cpu_seconds
from taproot_ops.bench.native import (
    FANOUT,
    ONE_QUEUE,
    TEN_QUEUES,
    PeerUnavailable,
    Tool,
    full_speed,
    paced_result,
    paced_run,
    stop,
)
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


def publisher(s: Server, stream: str, messages: int) -> list[str]:
    """`nats bench js pub async` creating `stream` (file storage), 500 in flight."""
    return [str(s.nats), "bench", "js", "pub", "async", f"{stream}.x", "--stream", stream, "--create",
            "--storage", "file", "--msgs", str(messages), "--size", "1KB", "--no-progress",
            # Twice the messages' bytes: ten streams of 4 GB each were refused for want of storage.
            "--maxbytes", f"{max(64, messages * 2 // 1024 + 1)}MB",
            "-s", s.url]


def add_consumer(s: Server, stream: str, consumer: str) -> None:
    """A durable pull consumer of every message, explicit acks."""
    s.cli("consumer", "add", stream, consumer, "--pull", "--deliver", "all", "--ack", "explicit", "--defaults")


def add_consumers(s: Server, pairs: list[tuple[str, str]]) -> None:
    """`add_consumer` for each (stream, consumer)."""
    for stream, consumer in pairs:
        add_consumer(s, stream, consumer)


def reader(s: Server, stream: str, messages: int, consumer: str) -> list[str]:
    """`nats bench js consume` reading `messages` through `consumer` (made by `add_consumer`)."""
    return [str(s.nats), "bench", "js", "consume", "--stream", stream, "--consumer", consumer,
            "--msgs", str(messages), "--size", "1KB", "--no-progress", "-s", s.url]


def tool(messages: int) -> Callable[[str], Tool]:
    """Reads a `nats bench` run of `messages` (it does not print the count)."""
    def parse(text: str) -> Tool:
        stats = parse_stats(text)
        return Tool(messages, stats["msg_s"], stats["ack_ms"])
    return parse


DRIVER = Path(__file__).resolve().parent / "drivers" / "natspaced"


def driver() -> Path:
    """`drivers/natspaced` (NATS's Go client) built once per version of its
    source into the tools directory."""
    import hashlib
    digest = hashlib.sha256(b"".join((DRIVER / name).read_bytes() for name in ("main.go", "go.mod", "go.sum")))
    target = tools_dir() / f"natspaced-{digest.hexdigest()[:12]}"
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise PeerUnavailable("building the paced NATS driver needs the Go toolchain (`go`) on the PATH")
    print("building the paced NATS driver (drivers/natspaced, nats.go) once ...", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["go", "build", "-o", str(target), "."], cwd=DRIVER, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise PeerUnavailable("building the paced NATS driver failed: "
                              + " ".join(out.stderr.strip().splitlines()[-3:]))
    return target


def paced(s: Server, stream: str, rate: float, seconds: float, warmup_s: float = 5) -> dict[str, Any]:
    """`rate` messages a second for `warmup_s` (not measured) and `seconds`:
    PUT->ACK and PUT->PUSH of each (the driver's JSON line)."""
    out = subprocess.run([str(driver()), "-s", s.url, "-stream", stream, "-rate", str(rate), "-seconds",
                          str(seconds), "-warmup", str(warmup_s), "-size", "1024"],
                         capture_output=True, text=True, timeout=seconds + warmup_s + 300)
    if out.returncode != 0:
        raise RuntimeError("the paced NATS driver failed: " + " ".join((out.stdout + out.stderr).strip()
                                                                       .splitlines()[-3:]))
    return paced_result(out.stdout)


def run_all(messages: int, fsync_messages: int, paced_s: float,
            runs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every run, appended to `runs` as it ends (a caller keeps those done if a later one fails)."""
    runs = [] if runs is None else runs
    for fsync in (False, True):
        durability = "fsync every write (sync_interval: always)" if fsync else "default (fsync every 2 min)"
        count = fsync_messages if fsync else messages
        with server(fsync=fsync) as s:
            for scenario, label, streams, readers in ((ONE_QUEUE, "1 stream", 1, 1), (TEN_QUEUES, "10 streams", 10, 1),
                                                     (FANOUT, "5 consumers", 1, 5)):
                names = [f"s{len(runs)}-{i}" for i in range(streams)]
                each = count // streams
                pairs = [(names[i % streams], f"c{i}") for i in range(max(streams, readers))]
                runs.append(full_speed(
                    "nats", scenario, label, durability, s.cpu_s,
                    [publisher(s, name, each) for name in names], tool(each),
                    [reader(s, name, each, consumer) for name, consumer in pairs], tool(each),
                    prepare=functools.partial(add_consumers, s, pairs)))
            runs.append(paced_run("nats", "10k msg/s, async publishes", durability, s.cpu_s,
                                  functools.partial(paced, s, "paced", 10_000, paced_s)))
    return runs


def main(argv: list[str] | None = None) -> int:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--messages", type=int, default=1_000_000, help="messages per full-speed run (1 KiB)")
        parser.add_argument("--fsync-messages", type=int, default=100_000,
                            help="messages per full-speed run with fsync on every write")
        parser.add_argument("--paced", type=float, default=20.0, help="seconds of the 10k msg/s run")
    return native_main(argv, __doc__, "nats", arguments,
                       lambda args: run_all(args.messages, args.fsync_messages, args.paced),
                       {"nats-server": SERVER[1], "natscli": CLI[1]})


if __name__ == "__main__":
    sys.exit(main())
