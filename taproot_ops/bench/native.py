"""What the peers' own-tool benchmarks (`kafka.py`, `nats_native.py`,
`rabbitmq_native.py`) share: jars fetched from Maven Central once, a
server process stopped, a run's printed line, and the command's main."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


class PeerUnavailable(RuntimeError):
    """A peer or its load tool cannot be had here; the message says why."""


def maven_jars(name: str, version: str, dependencies: list[tuple[str, str, str]], marker: str) -> Path:
    """`.cache/<name>-<version>/jars`: the (group, artifact, version)
    dependencies and theirs, fetched with Maven once (`marker`, a jar
    there, says it is done)."""
    from storage.spark import cache_dir
    target = cache_dir() / f"{name}-{version}" / "jars"
    if (target / marker).exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerUnavailable(f"Maven (mvn) is not installed: it fetches {name}'s jars from Maven Central")
    print(f"fetching {name} {version} from Maven Central into {target} (once) ...", flush=True)
    listed = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                     "</dependency>" for g, a, v in dependencies)
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "pom.xml").write_text(
            '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>taproot.bench</groupId><artifactId>{name}-jars</artifactId><version>1</version>"
            f"<dependencies>{listed}</dependencies></project>")
        out = subprocess.run([mvn, "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={target}"],
                             cwd=work, capture_output=True, text=True)
    if out.returncode != 0 or not (target / marker).exists():
        raise PeerUnavailable(f"Maven could not fetch {name} {version}: "
                              + " ".join((out.stdout + out.stderr).strip().splitlines()[-3:]))
    return target


def stop(process: "subprocess.Popen[bytes] | None", work: Path) -> None:
    """Stop a peer's server (SIGTERM, SIGKILL after 30 s) and remove its directory."""
    from taproot_ops.embedded import stop_popen
    if process is not None:
        stop_popen(process)
    shutil.rmtree(work, ignore_errors=True)


def full_speed(system: str, label: str, durability: str, messages: int, cpu_s: Callable[[], float],
               produce: Callable[[], dict[str, Any]], readers: list[Callable[[], Any]],
               consumed: Callable[[Any], float]) -> dict[str, Any]:
    """One full-speed run: `produce` (its tool's msg/s and ack latency),
    then the `readers` started at once and their rates summed, and the
    server's CPU over both per produced message (its deliveries included,
    as Taproot's server CPU per message). Printed, and returned."""
    cpu = cpu_s()
    produced = produce()
    started = [start() for start in readers]
    rates = [consumed(reader) for reader in started]
    run = {"system": system, "label": label, "durability": durability, "produce_msg_s": produced["msg_s"],
           "consume_msg_s": sum(rates), "ack_ms": produced["ack_ms"], "push_ms": None,
           "server_cpu_us_per_msg": (cpu_s() - cpu) * 1e6 / messages}
    print(line(system, run), flush=True)
    return run


def line(system: str, run: dict[str, Any]) -> str:
    """One run, as printed while the benchmark goes."""
    def num(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.1f}" if v < 10 else f"{v:,.0f}"
    ack, push = run.get("ack_ms") or {}, run.get("push_ms") or {}
    cpu = run.get("server_cpu_us_per_msg")
    return (f"{system} {run['label']:<17} [{run['durability']}]: produce {num(run['produce_msg_s'])} msg/s, consume "
            f"{num(run['consume_msg_s'])} msg/s, PUT->ACK p50 {num(ack.get('p50'))} / p99 {num(ack.get('p99'))} ms"
            + (f", PUT->PUSH p50 {num(push.get('p50'))} / p99 {num(push.get('p99'))} ms"
               + (f" ({push['note']})" if push.get("note") else "") if push else "")
            + (f", server CPU {cpu:.1f} us/msg" if cpu else ""))


def main(argv: list[str] | None, doc: str | None, system: str, add_arguments: Callable[[argparse.ArgumentParser], None],
         run_all: Callable[[argparse.Namespace], list[dict[str, Any]]], versions: dict[str, str]) -> int:
    """A peer benchmark's command: its arguments, --json, the runs; exit 2
    saying why when the peer cannot be had here."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--json", help="write the runs here")
    args = parser.parse_args(argv)
    try:
        runs = run_all(args)
    except PeerUnavailable as exc:
        print(f"{system}: not available here: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps({**versions, "runs": runs}, indent=1))
    return 0
