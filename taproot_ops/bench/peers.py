"""RabbitMQ and NATS for `taproot bench --compare`: installed from Debian's
packages if missing, started on loopback in a temp dir, stopped afterwards.

Durability, as configured (defaults otherwise; nothing tuned down):
- RabbitMQ 3.10: quorum queues, persistent messages, publisher confirms
  (sent once the message is in the Raft log, which RabbitMQ fsyncs in
  batches before confirming), manual consumer acks.
- NATS 2.9: JetStream, file storage, explicit acks; the PubAck is sent once
  the message is written to the stream's file (NATS fsyncs on an interval, as
  by default).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from taproot_ops.bench.settling import settle, tidy
from taproot_ops.embedded import free_port

PACKAGES = {"rabbitmq": ("rabbitmq-server", "rabbitmq-server"), "nats": ("nats-server", "nats-server")}
# The Python client each peer's driver uses: (module, pip requirement; as in pyproject's `bench` extra).
CLIENTS = {"rabbitmq": ("pika", "pika>=1.3"), "nats": ("nats", "nats-py>=2.9")}


class PeerSetupError(RuntimeError):
    """A peer's server or client cannot be had here; the message says how to get it."""


def prepare(system: str) -> None:
    """Before any scenario runs: the peer's server (Debian's package) and
    its Python client (pip, into this environment), installed if missing,
    saying so; PeerSetupError, saying how to install it, if that fails."""
    try:
        ensure_installed(system)
    except (OSError, subprocess.CalledProcessError) as exc:
        package = PACKAGES[system][1]
        raise PeerSetupError(f"{system}: could not install Debian's {package} ({exc}); install it with "
                             f"`apt-get install {package}` (as root) and run again") from None
    module, requirement = CLIENTS[system]
    if importlib.util.find_spec(module) is not None:
        return
    print(f"installing {requirement}, the {system} driver's Python client, into {sys.prefix} ...", flush=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    importlib.invalidate_caches()
    if pip.returncode != 0 or importlib.util.find_spec(module) is None:
        said = pip.stderr.strip().splitlines()[-1:] or ["not importable after installing"]
        raise PeerSetupError(f"{system}: could not install {requirement} ({said[0]}); install it with "
                             f"`{sys.executable} -m pip install '{requirement}'` (or `make bench-compare`, "
                             "which installs the bench extra)")


def ensure_installed(system: str) -> None:
    binary, package = PACKAGES[system]
    if shutil.which(binary) or Path(f"/usr/sbin/{binary}").exists():
        return
    print(f"installing {package} from Debian's packages ...", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        # A fresh machine may have no package lists yet.
        subprocess.run([*sudo, "apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(install, check=True, env=env, stdout=subprocess.DEVNULL)


def _wait_port(port: int, timeout_s: float, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s:.0f} s; see {log}")


@contextlib.contextmanager
def server(system: str) -> Iterator[str]:
    """Start `system` on loopback; yield its address."""
    ensure_installed(system)
    work = Path(tempfile.mkdtemp(prefix=f"taproot-bench-{system}-"))
    settle(str(work))
    port = free_port()
    log = work / "server.log"
    if system == "nats":
        (work / "nats.conf").write_text(
            f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{work / "js"}"\n}}\n')
        cmd, env = ["nats-server", "-c", str(work / "nats.conf")], dict(os.environ)
        started_s = 30.0
    else:
        (work / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n"
            f"management.tcp.ip = 127.0.0.1\n")
        (work / "enabled_plugins").write_text("[].\n")
        env = dict(os.environ, HOME=str(work), RABBITMQ_NODENAME=f"taprootbench{port}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(port),
                   RABBITMQ_DIST_PORT=str(free_port()), RABBITMQ_CONFIG_FILE=str(work / "rabbitmq"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(work / "enabled_plugins"),
                   RABBITMQ_MNESIA_BASE=str(work / "mnesia"), RABBITMQ_LOG_BASE=str(work / "log"),
                   RABBITMQ_PID_FILE=str(work / "rabbitmq.pid"), ERL_EPMD_ADDRESS="127.0.0.1",
                   ERL_EPMD_PORT=str(free_port()))
        cmd = ["/usr/lib/rabbitmq/bin/rabbitmq-server"]
        started_s = 120.0
    print(f"starting {system} on 127.0.0.1:{port} (data in {work}) ...", flush=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_port(port, started_s, process, log)
        if system == "rabbitmq":
            time.sleep(2)  # the AMQP listener opens just before the broker finishes booting
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
        if system == "rabbitmq":  # the broker's epmd (on its own port) outlives it
            subprocess.run(["epmd", "-kill"], env=env, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        tidy(work)
