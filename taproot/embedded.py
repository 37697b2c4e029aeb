"""An embedded cluster: node, proxy and pipeline as separate local processes.

Used by `taproot run` and by the integration tests. Each process writes a
ready file once it serves (with the port it bound, so port 0 works) and logs
to `<data>/logs/<role>.log`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import conf


class ClusterStartError(RuntimeError):
    pass


@dataclass
class Process:
    role: str
    popen: subprocess.Popen
    ready_file: Path
    log_file: Path
    info: dict = field(default_factory=dict)

    def wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready_file.exists():
                self.info = json.loads(self.ready_file.read_text())
                return self.info
            if self.popen.poll() is not None:
                raise ClusterStartError(f"{self.role} exited with {self.popen.returncode}; "
                                        f"log tail:\n{tail(self.log_file)}")
            time.sleep(0.05)
        raise ClusterStartError(f"{self.role} not ready after {timeout_s}s; log tail:\n{tail(self.log_file)}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


class EmbeddedCluster:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(self, config_file: str | None = None, data_dir: str | None = None, *,
                 ephemeral_ports: bool = False, with_pipeline: bool = True, with_proxy: bool = True):
        self.config_file = config_file
        self.config = conf.load(config_file, data_dir=data_dir)
        self.data_dir = os.path.abspath(self.config.data_dir)
        self.ephemeral_ports = ephemeral_ports
        self.with_pipeline = with_pipeline
        self.with_proxy = with_proxy
        self.processes: dict[str, Process] = {}
        self.node_address = ""
        self.proxy_address = ""
        self._run_dir = Path(tempfile.mkdtemp(prefix="taproot-run-"))

    def __enter__(self) -> "EmbeddedCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def client_address(self) -> str:
        return self.proxy_address or self.node_address

    def _spawn(self, role: str, args: list[str]) -> Process:
        logs = Path(self.data_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        ready = self._run_dir / f"{role}.ready"
        log_file = logs / f"{role}.log"
        common = ["--data-dir", self.data_dir, "--ready-file", str(ready)]
        if self.config_file:
            common += ["--config", self.config_file]
        with open(log_file, "ab") as log_fh:
            # A session of its own: Ctrl-C reaches only the launcher, which then
            # stops the roles in order (edge first, root last).
            popen = subprocess.Popen([sys.executable, "-m", "taproot.cli", role, *common, *args],
                                     stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        process = Process(role, popen, ready, log_file)
        self.processes[role] = process
        return process

    def start_node(self, timeout_s: float = 60, port: int | None = None) -> None:
        node = self.config.nodes[0]
        port_args = ["--port", str(port)] if port is not None else ["--port", "0"] if self.ephemeral_ports else []
        info = self._spawn("node", ["--name", node.name, *port_args]).wait_ready(timeout_s)
        self.node_address = f"{info['host']}:{info['port']}"

    def restart_node(self, timeout_s: float = 60) -> None:
        """Stop the node (SIGTERM) and start it again on the same port."""
        process = self.processes.pop("node")
        port = int(process.info["port"])
        process.stop()
        process.ready_file.unlink(missing_ok=True)
        self.start_node(timeout_s, port=port)

    def start_proxy(self, timeout_s: float = 60) -> None:
        proxy = self.config.proxies[0] if self.config.proxies else conf.ProxyConfig("proxy1")
        args = ["--name", proxy.name, "--upstream", self.node_address]
        if self.ephemeral_ports or not self.config.proxies:
            args += ["--port", "0"]
        info = self._spawn("proxy", args).wait_ready(timeout_s)
        self.proxy_address = f"{info['host']}:{info['port']}"

    def start_pipeline(self, timeout_s: float = 300) -> None:
        self._spawn("pipeline", ["--node-address", self.node_address]).wait_ready(timeout_s)

    def start(self) -> None:
        try:
            self.start_node()
            if self.with_proxy:
                self.start_proxy()
            if self.with_pipeline:
                self.start_pipeline()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # Edge first, root last: the proxy stops forwarding before the node goes.
        for role in ("proxy", "pipeline", "node"):
            process = self.processes.pop(role, None)
            if process is not None:
                process.stop()
        if not self.processes:
            shutil.rmtree(self._run_dir, ignore_errors=True)
