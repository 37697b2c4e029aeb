"""An embedded cluster: nodes, proxies and the pipeline as separate local processes.

Used by `taproot run` and by the integration tests. Each process writes a
ready file once it serves (with the port it bound, so port 0 works) and logs
to `<data>/logs/<name>.log`. Every node and proxy of the config is started
(`nodes=` / `proxies=` start fewer); each proxy's host list is every node,
its configured upstream first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import conf
from taproot_ops import tls_init, tokens


class ClusterStartError(RuntimeError):
    pass


def free_port() -> int:
    """A TCP port free on loopback now (for a server told its port up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop_popen(popen: "subprocess.Popen[bytes]", timeout_s: float = 30.0) -> int | None:
    """SIGTERM (a graceful stop), SIGKILL after `timeout_s`; the exit code."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)
    return popen.returncode


def python_under(launch_prefix: Sequence[str], code: str, *args: str, timeout_s: float = 60) -> str:
    """Run `code` (Python, given `args` as sys.argv[1:]) under `launch_prefix`
    (`ip netns exec NS`: inside another network namespace, where a server of
    that namespace is reachable) and return what it printed; OSError, with
    the end of its stderr, if it failed."""
    out = subprocess.run([*launch_prefix, sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise OSError(lines[-1] if lines else f"exited with {out.returncode}")
    return out.stdout


@dataclass
class Process:
    role: str
    popen: subprocess.Popen[bytes]
    ready_file: Path
    log_file: Path
    info: dict[str, Any] = field(default_factory=dict)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
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
        return stop_popen(self.popen, timeout_s)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def _check_port(role: str, port: int | None, wait: bool) -> None:
    if not wait and not port:
        raise ValueError(f"a {role} started without waiting needs a port")


def _address(process: Process, port: int | None, wait: bool, timeout_s: float) -> str:
    """Where a started node or proxy serves: from its ready file, or, not
    waiting for it, the port it was given (it may not listen yet)."""
    if not wait:
        return f"127.0.0.1:{port}"
    info = process.wait_ready(timeout_s)
    return f"{info['host']}:{info['port']}"


class EmbeddedCluster:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(self, config_file: str | None = None, data_dir: str | None = None, *,
                 ephemeral_ports: bool = False, with_pipeline: bool = True, with_proxy: bool = True,
                 warm_up: bool = True, state_dir: str | None = None,
                 launch_prefix: Callable[[str], Sequence[str]] | None = None):
        self.config_file = config_file
        self.config = conf.load(config_file, data_dir=data_dir, state_dir=state_dir)
        from storage.tables import absolute  # here: the CLI imports this module, and pyarrow with storage
        self.data_dir = absolute(self.config.data_dir)
        # Logs, pid files, auto TLS and token files: local even when the tables are not.
        self.state_dir = os.path.abspath(self.config.local_dir)
        self.ephemeral_ports = ephemeral_ports
        self.with_pipeline = with_pipeline
        self.with_proxy = with_proxy
        self.warm_up = warm_up
        self.processes: dict[str, Process] = {}
        self.node_addresses: dict[str, str] = {}     # node name -> host:port
        self.proxy_addresses: dict[str, str] = {}    # proxy name -> host:port
        self.http_ports: dict[str, int] = {}         # role name -> its metrics port (those that serve one)
        self.connect_url: str | None = None           # the pipeline's Spark Connect endpoint, once it is ready
        self.connect_token: str | None = None
        self._run_dir = Path(tempfile.mkdtemp(prefix="taproot-run-"))
        # A command each role's process runs under, by its name (`ip netns exec
        # NS`: each role on a host of its own); none by default.
        self.launch_prefix = launch_prefix or (lambda name: ())

    @property
    def node_address(self) -> str:
        """The first node's address."""
        return next(iter(self.node_addresses.values()), "")

    @property
    def proxy_address(self) -> str:
        """The first proxy's address."""
        return next(iter(self.proxy_addresses.values()), "")

    @property
    def proxy_names(self) -> list[str]:
        return [p.name for p in self.config.proxies] or ["proxy1"]

    def __enter__(self) -> "EmbeddedCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def client_address(self) -> str:
        return self.proxy_address or self.node_address

    @property
    def client_tls(self) -> Any:
        """What a client of this cluster needs (`protocol.tls.ClientTls`), None without TLS."""
        return conf.client_tls(self._config_for_roles)

    @property
    def client_token(self) -> str | None:
        """With `[auth] auto`: the `local` token (every right) for this
        machine's clients; else what TAPROOT_TOKEN(_FILE) says, or None."""
        return conf.client_token(self._config_for_roles)

    @property
    def cluster_token(self) -> str | None:
        """The token the roles present to each other (every right), for a
        role run in this process (a test's proxy); None with [auth] off."""
        return conf.cluster_token(self._config_for_roles)

    def client_env(self) -> dict[str, str]:
        """The TAPROOT_TLS_* variables a client process of this cluster needs
        (`protocol.tls.ClientTls.from_env`), and with `[auth] auto`
        TAPROOT_TOKEN_FILE naming the local token; empty without either."""
        from protocol.auth import ENV_TOKEN_FILE
        from protocol.tls import ENV_CA, ENV_CERT, ENV_KEY
        env = {}
        local = self.config.auth.local_token_file(self.state_dir) if self.config.auth.enabled else None
        if local:
            env[ENV_TOKEN_FILE] = os.path.abspath(local)
        if not self.config.tls.enabled:
            return env
        ca, cert, key = self.config.tls.files(self.state_dir)
        env[ENV_CA] = os.path.abspath(ca)
        if self.config.tls.client_certs:
            env.update({ENV_CERT: os.path.abspath(cert), ENV_KEY: os.path.abspath(key)})
        return env

    @property
    def _config_for_roles(self) -> conf.ClusterConfig:
        return dataclasses.replace(self.config, data_dir=self.data_dir, state_dir=self.state_dir)

    def _spawn(self, role: str, args: list[str], name: str | None = None) -> Process:
        name = name or role
        logs = Path(self.state_dir) / "logs"
        try:
            logs.mkdir(parents=True, exist_ok=True)
            # `[tls] auto`: a throwaway CA and certificate for this cluster, once.
            if tls_init.ensure(self._config_for_roles):
                print(f"TLS on: a throwaway CA and certificate made in {self.state_dir}/tls", flush=True)
            # `[auth] auto`: the cluster token, a local token with every right and the Spark Connect token, once.
            if tokens.init(self._config_for_roles):
                print(f"auth on: the cluster token, a local token and the Spark Connect token made in "
                      f"{self.state_dir}/auth", flush=True)
        except OSError as exc:   # a file where the directory should be, no permission, a full disk
            what = "data directory" if self.state_dir == self.data_dir else "state directory"
            raise ClusterStartError(f"{what} {self.state_dir} cannot be used: cannot create "
                                    f"{exc.filename}: {exc.strerror}") from None
        ready = self._run_dir / f"{name}.ready"
        ready.unlink(missing_ok=True)
        log_file = logs / f"{name}.log"
        common = ["--data-dir", self.data_dir, "--state-dir", self.state_dir, "--ready-file", str(ready)]
        if self.config_file:
            common += ["--config", self.config_file]
        with open(log_file, "ab") as log_fh:
            # A session of its own: Ctrl-C reaches only the launcher, which then
            # stops the roles in order (edge first, root last).
            popen = subprocess.Popen([*self.launch_prefix(name), sys.executable, "-m", "taproot_ops.cli", role,
                                      *common, *args],
                                     stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        process = Process(role, popen, ready, log_file)
        self.processes[name] = process
        return process

    def _port_args(self, port: int | None) -> list[str]:
        """--port (and, with ephemeral ports, --http-port 0: any free one)."""
        http = ["--http-port", "0"] if self.ephemeral_ports else []
        return (["--port", str(port)] if port is not None else ["--port", "0"] if self.ephemeral_ports else []) + http

    def _note_http(self, name: str, process: Process) -> None:
        port = process.info.get("http_port") if process.info else None
        if port:
            self.http_ports[name] = int(port)

    def metrics_url(self, name: str) -> str:
        """http://host:port/metrics of a started role (node, proxy or `pipeline`)."""
        info = self.processes[name].info or {}
        return f"http://{info.get('host') or '127.0.0.1'}:{self.http_ports[name]}/metrics"

    def start_nodes(self, timeout_s: float = 60, names: list[str] | None = None) -> None:
        """Start nodes (all of the config's by default) and wait until each serves."""
        names = names or [n.name for n in self.config.nodes]
        started = [(name, self._spawn("node", ["--name", name, *self._port_args(None)], name)) for name in names]
        for name, process in started:
            info = process.wait_ready(timeout_s)
            self.node_addresses[name] = f"{info['host']}:{info['port']}"
            self._note_http(name, process)

    def start_node(self, timeout_s: float = 60, port: int | None = None, name: str | None = None,
                   wait: bool = True) -> Process:
        """Start a node; with `wait=False` (a given `port` needed) return at once."""
        name = name or self.config.nodes[0].name
        _check_port("node", port, wait)
        process = self._spawn("node", ["--name", name, *self._port_args(port)], name)
        self.node_addresses[name] = _address(process, port, wait, timeout_s)
        self._note_http(name, process)
        return process

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Stop one process: SIGTERM (graceful) by default, or SIGKILL."""
        process = self.processes.pop(name)
        if sig == signal.SIGTERM:
            return process.stop(timeout_s)
        # The whole process group, as a crash of its machine would: the
        # pipeline's JVM is a child of its Python process.
        os.killpg(process.popen.pid, sig)
        return process.popen.wait(timeout_s)

    def restart_node(self, timeout_s: float = 60, name: str | None = None) -> None:
        """Stop a node (SIGTERM) and start it again on the same port."""
        name = name or self.config.nodes[0].name
        process = self.processes[name]
        port = int(process.info["port"])
        self.stop_process(name)
        self.start_node(timeout_s, port=port, name=name)

    def start_proxy(self, timeout_s: float = 60, name: str | None = None, port: int | None = None,
                    hosts: list[str] | None = None, wait: bool = True) -> Process:
        """Start a proxy of the config (or, with `hosts`, any proxy in front of
        those nodes); with `wait=False` (a given `port` needed) return at once."""
        name = name or self.proxy_names[0]
        if hosts is None:
            proxy = self.config.proxy(name) if self.config.proxies else conf.ProxyConfig(name)
            first = proxy.upstream or self.config.nodes[0].name
            hosts = [self.node_addresses[first]] + [a for n, a in self.node_addresses.items() if n != first]
        args = ["--name", name, "--upstream", *hosts]
        if port is not None:
            args += ["--port", str(port)]
        elif self.ephemeral_ports or not self.config.proxies:
            args += ["--port", "0"]
        if self.ephemeral_ports or not self.config.proxies:
            args += ["--http-port", "0"]
        _check_port("proxy", port, wait)
        process = self._spawn("proxy", args, name)
        self.proxy_addresses[name] = _address(process, port, wait, timeout_s)
        self._note_http(name, process)
        return process

    def start_pipeline(self, timeout_s: float = 300, warm_up: bool = True, wait: bool = True) -> Process:
        """Start the pipeline; it is ready once its queries run (after a node
        made the PUT logs). With `wait=False`, return at once."""
        args = ["--node-address", self.node_address] + ([] if warm_up else ["--no-warm-up"])
        if self.ephemeral_ports:
            args += ["--http-port", "0", "--connect-port", "0"]
        process = self._spawn("pipeline", args)
        if wait:
            self.pipeline_ready(process, timeout_s)
        return process

    def pipeline_ready(self, process: Process, timeout_s: float) -> None:
        """Wait for a pipeline started with `wait=False` (ClusterStartError
        if it exits or is not ready in time)."""
        process.wait_ready(timeout_s)
        self._note_http("pipeline", process)
        port = (process.info or {}).get("connect_port")
        self.connect_url = f"sc://{self.config.pipeline.connect_host}:{port}" if port else None
        self.connect_token = conf.connect_token(self.config)   # what the endpoint requires, with [auth] on

    def start(self) -> None:
        try:
            self.start_nodes()
            if self.with_proxy:
                for name in self.proxy_names:
                    self.start_proxy(name=name)
            if self.with_pipeline:
                self.start_pipeline(warm_up=self.warm_up)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # Edge first, root last: proxies stop forwarding before the nodes go.
        for role in ("proxy", "pipeline", "node"):
            for name, process in list(self.processes.items()):
                if process.role == role:
                    self.processes.pop(name).stop()
        if not self.processes:
            shutil.rmtree(self._run_dir, ignore_errors=True)
