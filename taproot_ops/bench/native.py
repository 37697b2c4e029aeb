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
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

# The comparison's scenarios (every system's runs name one of them, and
# `compare.tables` makes one table of each).
ONE_QUEUE = "1 queue, full speed"
TEN_QUEUES = "10 queues, full speed"
FANOUT = "fanout to 5, full speed"
PACED = "10k msg/s, paced"
SCENARIOS = (ONE_QUEUE, TEN_QUEUES, FANOUT, PACED)


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


@dataclass
class Tool:
    """One load tool's result: how many messages, at what rate over its own
    window, (publishers) its acknowledgement latency percentiles (ms), and
    when it exited (`time.monotonic()`, set by `together`)."""
    count: int
    msg_s: float
    ack_ms: dict[str, float] | None = None
    ended: float = 0.0


def together(commands: list[list[str]], parse: Callable[[str], Tool], timeout_s: float = 900) -> list[Tool]:
    """Runs the commands at once (a thread waits on each, so its exit time is
    when it exited); each one's output parsed, and its window's end (exit)."""
    results: list[Any] = [None] * len(commands)

    def wait(i: int, process: "subprocess.Popen[str]") -> None:
        try:
            text, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            results[i] = RuntimeError(f"{' '.join(commands[i][:5])} ... took over {timeout_s:.0f} s")
            return
        ended = time.monotonic()
        try:
            if process.returncode != 0:
                raise RuntimeError(f"exited with {process.returncode}: " + " ".join(text.strip().splitlines()[-3:]))
            results[i] = replace(parse(text), ended=ended)
        except RuntimeError as exc:
            results[i] = exc

    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  stdin=subprocess.DEVNULL) for c in commands]
    threads = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = next((r for r in results if isinstance(r, Exception)), None)
    if failed is not None:
        raise RuntimeError(str(failed))
    return results


def aggregate_rate(tools: list[Tool]) -> float:
    """Messages a second over the union of the tools' windows: each window
    ends when its tool exited and lasts count / msg_s (its own measured
    span). One tool: its own rate. Several that did not overlap fully are not
    credited with the sum of their rates."""
    if len(tools) == 1:
        return tools[0].msg_s
    starts = [t.ended - t.count / t.msg_s for t in tools]
    return sum(t.count for t in tools) / (max(t.ended for t in tools) - min(starts))


def worst_latency(tools: list[Tool]) -> dict[str, float] | None:
    """Several publishers' acknowledgement latency: the worst of their
    percentiles (their samples are not at hand to merge)."""
    found = [t.ack_ms for t in tools if t.ack_ms]
    if not found:
        return None
    return {q: max(a[q] for a in found) for q in found[0] if all(q in a for a in found)}


def full_speed(system: str, scenario: str, label: str, durability: str, cpu_s: Callable[[], float],
               producers: list[list[str]], parse_produced: Callable[[str], Tool],
               readers: list[list[str]], parse_consumed: Callable[[str], Tool],
               prepare: Callable[[], None] | None = None) -> dict[str, Any]:
    """One full-speed run: the `producers` at once (their tools' rates over
    the union of their windows, their ack latency the worst of theirs), then
    the `readers` at once (the same), and the server's CPU over both per
    produced message (its deliveries included, as Taproot's server CPU per
    message). `prepare` runs between them (consumers to create). Printed,
    and returned."""
    cpu = cpu_s()
    produced = together(producers, parse_produced)
    if prepare is not None:
        prepare()
    consumed = together(readers, parse_consumed)
    messages = sum(t.count for t in produced)
    run = {"system": system, "scenario": scenario, "label": label, "durability": durability,
           "produce_msg_s": aggregate_rate(produced),
           "consume_msg_s": aggregate_rate(consumed), "ack_ms": worst_latency(produced), "push_ms": None,
           "server_cpu_us_per_msg": (cpu_s() - cpu) * 1e6 / messages,
           "tools": {"producers": len(producers), "readers": len(readers)}}
    print(line(system, run), flush=True)
    return run


def paced_run(system: str, label: str, durability: str, cpu_s: Callable[[], float],
              drive: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One paced run: `drive` runs a paced driver (`drivers/`) and returns its
    result (`paced_result`); the server's CPU over it per message sent, the
    driver's warm-up included. Printed, and returned."""
    cpu = cpu_s()
    result = drive()
    run = {"system": system, "scenario": PACED, "label": label, "durability": durability,
           "produce_msg_s": result["produce_msg_s"], "consume_msg_s": result["consume_msg_s"],
           "ack_ms": result["ack_ms"], "push_ms": result["push_ms"],
           "server_cpu_us_per_msg": (cpu_s() - cpu) * 1e6 / result["records"]}
    print(line(system, run), flush=True)
    return run


def paced_result(text: str) -> dict[str, Any]:
    """A paced driver's JSON line (`drivers/`): every record acknowledged and
    received, or an error saying how many were not."""
    found = [line for line in text.splitlines() if line.startswith("{")]
    if not found:
        raise RuntimeError(f"no result from the paced driver: {text[-500:]}")
    try:
        result: dict[str, Any] = json.loads(found[-1])
    except ValueError as exc:
        raise RuntimeError(f"the paced driver's result is not JSON ({exc}): {found[-1][:200]}") from None
    if result["errors"] or result["received"] < result["records"]:
        raise RuntimeError(f"the paced run lost records: {result['errors']} sends failed, {result['received']:,} "
                           f"of {result['records']:,} received")
    return result


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
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"{system}: a run failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        Path(args.json).write_text(json.dumps({**versions, "runs": runs}, indent=1))
    return 0
