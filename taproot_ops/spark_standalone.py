"""A Spark standalone cluster on this machine, started with Spark's own
launcher from the pyspark install (`bin/spark-class ...deploy.master.Master`
and `...deploy.worker.Worker`): what the cluster test tier runs the pipeline
on, and `taproot spark-cluster` for a user who wants to try it
(docs/deploy.md). Loopback only."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from taproot_ops.embedded import free_port, python_under, stop_popen

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).resolve().parent


class SparkStandaloneError(RuntimeError):
    pass


class SparkStandalone:
    """A master and `workers` workers (each `cores` cores, `memory` of
    executor memory), logs and work files in `directory`. A context manager;
    `master_url` is what `[pipeline] spark_master` takes."""

    def __init__(self, directory: str | Path, workers: int = 1, cores: int = 1, memory: str = "2g",
                 host: str = "127.0.0.1", launch_prefix: Sequence[str] = (), env: dict[str, str] | None = None):
        """`launch_prefix`: a command the master and workers run under (`ip
        netns exec NS`: a network namespace of their own, on `host`);
        `env`: more environment for them, which their executors inherit
        (an object store's credentials)."""
        self.directory = Path(directory)
        self.workers, self.cores, self.memory, self.host = workers, cores, memory, host
        self.launch_prefix, self.env = list(launch_prefix), dict(env or {})
        own = bool(self.launch_prefix)   # in a namespace of its own: Spark's default ports are free
        self.port = 7077 if own else free_port()
        self.ui_port = 8080 if own else free_port()
        self._worker_ui_ports = [8081 + i if own else free_port() for i in range(workers)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.directory.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **self.env, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP=self.host,
                   SPARK_LOG_DIR=str(self.directory), SPARK_WORKER_DIR=str(self.directory / "work"))
        from storage.spark import jvm_options
        # The master's and worker's own JVMs.
        env["SPARK_DAEMON_JAVA_OPTS"] = f"{env.get('SPARK_DAEMON_JAVA_OPTS', '')} {jvm_options()}".strip()
        with open(self.directory / f"{name}.log", "ab") as log:
            process = subprocess.Popen([*self.launch_prefix, str(spark_home() / "bin" / "spark-class"), *args],
                                       stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, apps."""
        url = f"http://{self.host}:{self.ui_port}/json/"
        if not self.launch_prefix:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return dict(json.load(reply))
        # Reachable only from inside its namespace: ask from there.
        return dict(json.loads(python_under(
            self.launch_prefix, "import sys, urllib.request; "
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())", url, timeout_s=30)))

    def _wait(self, what: str, ready: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise SparkStandaloneError(f"{what}: a Spark process exited with {process.returncode}; "
                                               f"see {self.directory}/*.log")
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass  # not up yet; a web UI that has just bound its port may answer an empty page
            time.sleep(0.3)
        raise SparkStandaloneError(f"{what}: not ready within {timeout_s:.0f} s; see {self.directory}/*.log")

    def start(self, timeout_s: float = 90) -> "SparkStandalone":
        self._launch("master", [MASTER_CLASS, "--host", self.host, "--port", str(self.port),
                                "--webui-port", str(self.ui_port)])
        self._wait("the Spark master", lambda: self.state().get("status") == "ALIVE", timeout_s)
        for i in range(self.workers):
            self._launch(f"worker-{i + 1}", [WORKER_CLASS, self.master_url, "--host", self.host,
                                             "--cores", str(self.cores), "--memory", self.memory,
                                             "--webui-port", str(self._worker_ui_ports[i]),
                                             "--work-dir", str(self.directory / "work")])
        self._wait(f"{self.workers} Spark worker(s)", lambda: sum(
            w.get("state") == "ALIVE" for w in self.state().get("workers", [])) >= self.workers, timeout_s)
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):   # workers first (they kill their executors), then the master
            stop_popen(process, 15)
        self.processes.clear()

    def __enter__(self) -> "SparkStandalone":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
