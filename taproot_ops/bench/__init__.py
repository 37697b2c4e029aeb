"""`taproot bench`: a load tool in the manner of BlazingMQ's `bmqtool` auto mode.

    taproot bench                                   # priority 1Q/1P/1C, 1 KiB, max rate, 10 s
    taproot bench --scenario all --out bench-out    # BlazingMQ's published scenarios
    taproot bench --mode fanout --consumers 5 --rate 10000 --duration 20
    taproot bench --compare --out bench-out         # Kafka, NATS, RabbitMQ with their own tools, and Taproot
    taproot bench --scenario all --compare-python   # RabbitMQ and NATS through Python clients, same scenarios
    taproot bench --scenario priority-1q-batch priority-1q --repeat 3 --duration 20   # median and range of 3 runs each
    taproot bench --replay 1000000 --size 32        # replay throughput
    taproot bench --pipeline 600000                 # the dedup pipeline's CPU per row, alone
    taproot bench --history 6000000                 # the dedup's cost as its GUID history grows

Producers and consumers run as separate processes against an embedded cluster
(temp dir, ephemeral ports, the domains the scenarios need) or a running one
(`--hosts`). Results: a summary per scenario on stdout, JSON (`--json`, and
`results.json` in `--out`), and one PNG per run in `--out` (throughput and
latency over time).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import multiprocessing as mp
import os
import platform
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import conf
from taproot_ops.bench import machine
from taproot_ops.bench.report import fmt_ms, fmt_spread, plot, spread
from taproot_ops.bench.scenarios import QUEUE_SWEEP, SCENARIOS, TAPROOT_ONLY, Scenario
from taproot_ops.bench.settling import settle, tidy


def scenarios_from(args: argparse.Namespace) -> list[Scenario]:
    names = args.scenario or []
    expanded: list[str] = []
    for name in names:
        expanded += list(SCENARIOS) if name == "all" else list(QUEUE_SWEEP) if name == "queues" else [name]
    names = list(dict.fromkeys(expanded))
    known = {**SCENARIOS, **QUEUE_SWEEP, **TAPROOT_ONLY}
    overrides = {k: v for k, v in (("size", args.size), ("rate", args.rate), ("duration_s", args.duration),
                                   ("batch", args.batch), ("window", args.window)) if v is not None}
    custom = {k: v for k, v in (("mode", args.mode), ("queues", args.queues), ("producers", args.producers),
                                ("consumers", args.consumers),
                                ("queues_per_client", getattr(args, "queues_per_client", None))) if v is not None}
    if custom and names:
        raise ValueError("give --scenario or --mode/--queues/--producers/--consumers/--queues-per-client, not both")
    if custom or not names:
        return [Scenario("custom" if custom else "priority-1q", **custom, **overrides)]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; known: all, queues, {', '.join(known)}")
    return [known[n].with_(**overrides) for n in names]


SHIPPED_TLS = "[tls]                                  # TLS on every gRPC link (docs/operations.md)\nenabled = true\n"
SHIPPED_AUTH = ("[auth]                                 # tokens with rights per domain: produce, consume, admin "
                "(docs/operations.md)\nenabled = true\n")


def parse_setting(item: str) -> tuple[str, str, str]:
    """`--set`'s SECTION.KEY=VALUE as (section, key, value), the value a
    TOML value; SystemExit, naming the setting, for anything else."""
    import tomllib

    name, sep, value = item.partition("=")
    section, dot, key = name.strip().rpartition(".")
    value = value.strip()
    if not sep or not dot or not section or not key or not value or "\n" in value:
        raise SystemExit(f"error: --set {item!r}: expected SECTION.KEY=VALUE, e.g. "
                         "primary.compact_every_commits=0")
    try:
        tomllib.loads(f"v = {value}")
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"error: --set {item!r}: {value!r} is not a TOML value ({exc}); strings are "
                         "quoted, e.g. '\"zstd\"'") from None
    return section, key, value


def apply_settings(text: str, settings: Sequence[str]) -> str:
    """`text` (a cluster.toml) with each `section.key=value` of `settings`
    (`taproot bench --set`) in place of what it sets: the value a TOML value
    (`0`, `true`, `"zstd"`), the key one the file sets in that section's table.
    SystemExit, naming the setting, for anything else."""
    for item in settings:
        section, key, value = parse_setting(item)
        header = re.search(rf"^\[{re.escape(section)}\][ \t]*(#[^\n]*)?$", text, flags=re.M)
        if header is None:
            raise SystemExit(f"error: --set {item!r}: the shipped cluster.toml has no [{section}] table")
        end = re.search(r"^\[", text[header.end():], flags=re.M)
        body_end = header.end() + (end.start() if end else len(text[header.end():]))
        body, found = re.subn(rf"^{re.escape(key)}[ \t]*=[^#\n]*", f"{key} = {value}  ", text[header.end():body_end],
                              count=1, flags=re.M)
        if not found:
            raise SystemExit(f"error: --set {item!r}: [{section}] of the shipped cluster.toml sets no {key} "
                             "(see conf/cluster.toml)")
        text = text[:header.end()] + body + text[body_end:]
    return text


DOMAIN_SECTION = "domain"   # `--set domain.KEY=VALUE`: a setting of every scenario's domain


def apply_domain_settings(text: str, settings: Sequence[str]) -> str:
    """`text` (a bench domain file) with each `domain.key=value` of
    `settings` among its top-level keys (before its first table), in place
    of the same key if it sets it."""
    for item in settings:
        _, key, value = parse_setting(item)
        first_table = re.search(r"^\[", text, flags=re.M)
        top_end = first_table.start() if first_table else len(text)
        top, found = re.subn(rf"^{re.escape(key)}[ \t]*=[^\n]*", f"{key} = {value}", text[:top_end],
                             count=1, flags=re.M)
        if not found:
            top += f"{key} = {value}\n"
        text = top + text[top_end:]
    return text


def write_bench_config(directory: Path, scenarios: list[Scenario], name: str | None = None,
                       extra: str = "", tls: bool = False, auth: bool = False,
                       pipeline: dict[str, str] | None = None, settings: Sequence[str] = ()) -> Path:
    """The shipped cluster.toml plus the domains the scenarios need; with
    `name`, the cluster's name, and `extra` (TOML sections) appended;
    `pipeline`: [pipeline] settings (TOML values) in place of the shipped ones. TLS as shipped
    with `tls`, token auth as shipped with `auth`, else off (plaintext and
    no tokens, as the older figures were measured). `settings`: `--set`'s
    (`apply_settings`), last, so they win, and those of the `domain`
    section in every scenario's domain file (`apply_domain_settings`); the
    result must load (`conf.load`), or SystemExit says why."""
    import conf
    from taproot_ops.bench.taproot_driver import domain_file, domain_name

    directory.mkdir(parents=True, exist_ok=True)
    cluster_file = directory / "cluster.toml"
    text = conf.DEFAULT_CLUSTER_FILE.read_text()
    if name is not None:
        shipped = 'name = "local"'
        assert shipped in text, "the shipped cluster.toml names its cluster"
        text = text.replace(shipped, f'name = "{name}"', 1)
    assert SHIPPED_TLS in text, "the shipped cluster.toml turns TLS on"
    assert SHIPPED_AUTH in text, "the shipped cluster.toml turns token auth on"
    if not tls:
        text = text.replace(SHIPPED_TLS, SHIPPED_TLS.replace("enabled = true", "enabled = false"), 1)
    if not auth:
        text = text.replace(SHIPPED_AUTH, SHIPPED_AUTH.replace("enabled = true", "enabled = false"), 1)
    domain_settings = [item for item in settings if parse_setting(item)[0] == DOMAIN_SECTION]
    text = apply_settings(text, [f"pipeline.{key}={value}" for key, value in (pipeline or {}).items()]
                          + [item for item in settings if item not in domain_settings])
    cluster_file.write_text(text + extra)
    domains = directory / "domains"
    domains.mkdir(exist_ok=True)
    for scenario in scenarios:
        (domains / f"{domain_name(scenario)}.toml").write_text(apply_domain_settings(domain_file(scenario),
                                                                                       domain_settings))
    if settings:
        try:
            conf.load(cluster_file, data_dir=str(directory / "unused"))
        except conf.ConfigError as exc:
            raise SystemExit(f"error: --set {' '.join(settings)}: {exc}") from None
    return cluster_file


# `taproot_put_ack_phase_seconds`'s phases, as the bench prints them.
PHASE_NAMES = {"to_node": "to the node", "group": "waiting for its group commit", "commit": "commit"}


def print_result(r: dict[str, Any]) -> None:
    failed = sum(r["failed"].values())
    print(f"{r['system']:>8} {r['label']}: produce {r['produce_msg_s']:,.0f} msg/s, consume "
          f"{r['consume_msg_s']:,.0f} msg/s; acked {r['acked']:,} of {r['posted']:,} (failed {failed:,}), "
          f"received {r['received']:,} of {r['expected_received']:,}")
    print(f"         PUT->ACK  {fmt_ms(r['ack_ms'])}")
    print(f"         PUT->PUSH {fmt_ms(r['push_ms'])}", flush=True)
    phases = r.get("put_ack_phases_ms")
    if phases:
        print("         PUT->ACK at the nodes, mean ms: " + ", ".join(
            f"{PHASE_NAMES.get(phase, phase)} {ms:,.1f}" for phase, ms in phases.items())
            + f" (together {sum(phases.values()):,.1f}"
            + (f"; the producers saw {r['ack_mean_ms']:,.1f} on average)"
               if r.get("ack_mean_ms") is not None else ")"), flush=True)
    slow = r.get("put_ack_phases_slow")
    if slow:
        print("         PUT->ACK at the nodes, messages whose phase took over 50 ms: " + ", ".join(
            f"{PHASE_NAMES.get(phase, phase)} {share * 100:.2f}%" for phase, share in slow.items()), flush=True)
    bundled = r.get("node_frames_a_message")
    if bundled:
        print("         frames a gRPC message at the nodes: " + ", ".join(
            f"{direction} {ratio:,.2f}" for direction, ratio in sorted(bundled.items())), flush=True)
    synced = r.get("node_fsyncs")
    if synced:
        print(f"         fsyncs at the nodes: {synced['count']:,.0f}, mean {synced['mean_ms']:,.2f} ms, "
              f"{synced['slow_share'] * 100:.1f}% over 10 ms", flush=True)
    commits = r.get("node_group_commits")
    if commits:
        print("         group commits at the nodes: " + ", ".join(
            f"{log} {c['count']:,.0f} of {c['messages']:,.1f} messages" for log, c in sorted(commits.items())),
            flush=True)
    if r.get("apps"):
        print("         per app (received/expected, not matching its subscription, duplicates): " + ", ".join(
            f"{app} {e['received']:,}/{e['expected']:,} ({e['wrong']}, {e['duplicates']})"
            for app, e in r["apps"].items()))
    minutes = r.get("minutes", {}).get("push", {})
    if len(minutes.get("t", [])) > 1:
        print("         PUT->PUSH per minute (p50/p99 ms): " + ", ".join(
            f"{t / 60:.0f}: {p50:,.0f}/{p99:,.0f}" for t, p50, p99 in zip(minutes["t"], minutes["p50"],
                                                                         minutes["p99"])))
    if r.get("cpu_s"):
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in r["cpu_s"].items())
        print(f"         server CPU {parts}: {r['cpu_us_per_msg']:,.0f} us per message", flush=True)
    if r.get("client_cpu_s"):
        parts = ", ".join(f"{role} {seconds:.1f} s" for role, seconds in r["client_cpu_s"].items())
        per_message = sum(r["client_cpu_s"].values()) * 1e6 / max(1, r.get("acked", 0))
        print(f"         load generator CPU (same window, same cores) {parts}: {per_message:,.0f} us per message",
              flush=True)
    if r.get("rss_mb"):
        parts = ", ".join(f"{name} {min(mb for _, mb in s):,.0f}-{max(mb for _, mb in s):,.0f} (end "
                          f"{s[-1][1]:,.0f})" for name, s in r["rss_mb"].items() if s)
        print(f"         server memory, MiB resident over the run: {parts}", flush=True)
    minutes_mb = r.get("rss_minutes_mb") or {}
    if any(len(m) > 1 for m in minutes_mb.values()):
        print("         server memory per minute, median MiB resident: " + "; ".join(
            f"{name} " + ", ".join(f"{m}: {mb:,.0f}" for m, mb in enumerate(series))
            for name, series in minutes_mb.items()), flush=True)
    authority = r.get("authority")
    if authority:
        lag = authority["lag_ms"]
        print(f"         authority lag (PUT commit -> delivery row) {fmt_ms(lag)}; {authority['rows']:,} of "
              f"{authority['expected']:,} rows after {authority['waited_s']:.0f} s; "
              f"disagreements {authority['disagreements']}", flush=True)
        minutes = authority.get("minutes") or {}
        if len(minutes.get("t", [])) > 1:
            print("         authority lag per minute of PUTs (p50/p99 s): " + ", ".join(
                f"{t / 60:.0f}: {p50 / 1000:,.1f}/{p99 / 1000:,.1f}" for t, p50, p99 in zip(
                    minutes["t"], minutes["p50"], minutes["p99"])), flush=True)
        if authority.get("cpu_s"):
            parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in authority["cpu_s"].items())
            closes = r.get("cpu_closes_s") or {}
            within = (" (the clients' queue closes after the run took "
                      + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in closes.items()) + " of it)"
                      if sum(closes.values()) >= 0.5 else "")
            print(f"         server CPU until the authority caught up: {parts}: "
                  f"{authority['cpu_us_per_msg']:,.0f} us per message{within}", flush=True)
    if r.get("machine"):
        print(f"         {machine.fmt(r['machine'])}", flush=True)


def run_system(system: str, address: str, scenarios: list[Scenario], args: argparse.Namespace,
               out_dir: Path | None,
               cpu_probe: Any = None, memory_probe: Any = None, cluster: Any = None,
               consumer_address: str | None = None, phase_probe: Any = None) -> list[dict[str, Any]]:
    """Each scenario on one system. With `cluster` (Taproot's embedded one),
    also the authority's lag and disagreements, from its tables."""
    from taproot_ops.bench.runner import run

    results = []
    times = Counter(s.name for s in scenarios)   # > 1: `--repeat`
    done: Counter[str] = Counter()
    for scenario in scenarios:
        done[scenario.name] += 1
        nth = f", run {done[scenario.name]} of {times[scenario.name]}" if times[scenario.name] > 1 else ""
        print(f"{system}: {scenario.label}, {scenario.size} B, "
              f"{'max rate' if not scenario.rate else f'{scenario.rate:,.0f} msg/s'}, {scenario.duration_s:g} s{nth}",
              flush=True)
        with machine.Sampler() as speed:   # how fast the shared host let the cores run (machine.py)
            result = run(system, address, scenario, workers=args.workers,
                         drain_idle_s=args.drain_idle if args.drain_idle is not None else
                         (60.0 if system == "taproot" else 10.0), cpu_probe=cpu_probe, memory_probe=memory_probe,
                         consumer_address=consumer_address, phase_probe=phase_probe,
                         client_gc=getattr(args, "client_gc", "tuned"))
        result["machine"] = speed.summary()
        if cluster is not None and scenario.mode != "broadcast":
            from taproot_ops.bench.authority import authority_lag
            from taproot_ops.bench.taproot_driver import domain_name
            result["authority"] = authority_lag(cluster.data_dir, cluster.config.partitions,
                                                domain_name(scenario), result["start_s"], result["acked"])
            if cpu_probe is not None:
                from taproot_ops.bench.cpu import delta
                total = delta(result["cpu_before"], cpu_probe())
                result["authority"]["cpu_s"] = total
                result["authority"]["cpu_us_per_msg"] = sum(total.values()) * 1e6 / max(1, result["acked"])
        print_result(result)
        if out_dir is not None:
            png = out_dir / f"{system}-{scenario.name}{f'-{done[scenario.name]}' if nth else ''}.png"
            plot(result, str(png), f"{system}: {scenario.label}, {scenario.size} B")
            result["plot"] = str(png)
        results.append(result)
    return results


# `--system` -> (the module in this package, its flag for the length of a run).
NATIVE_PEERS = {"kafka": ("kafka", "--paced"), "nats-native": ("nats_native", "--paced"),
                "rabbitmq-native": ("rabbitmq_native", "--seconds")}


def main(args: argparse.Namespace) -> int:
    repeat = getattr(args, "repeat", 1)
    if repeat < 1:
        print(f"error: --repeat {repeat}: give 1 or more runs of each scenario", file=sys.stderr)
        return 2
    alone = [flag for flag, on in (("--replay", args.replay), ("--pipeline", getattr(args, "pipeline", 0)),
                                   ("--history", getattr(args, "history", 0)),
                                   ("--compare", getattr(args, "compare", False)),
                                   (f"--system {args.system}", args.system in NATIVE_PEERS)) if on]
    if repeat > 1 and alone:
        print(f"error: --repeat repeats the --scenario runs; {alone[0]} runs a measurement of its own "
              f"(run it again instead)", file=sys.stderr)
        return 2
    if args.replay:
        return _replay_main(args)
    if getattr(args, "pipeline", 0):
        return _pipeline_main(args)
    if getattr(args, "history", 0):
        return _history_main(args)
    if args.system in NATIVE_PEERS:
        # A peer with its own load tools: its module's own runs, the duration given as its flag.
        module, duration_flag = NATIVE_PEERS[args.system]
        peer = importlib.import_module(f"taproot_ops.bench.{module}")
        return int(peer.main([duration_flag, str(args.duration or 20)] + (["--json", args.json] if args.json else [])))
    if getattr(args, "compare", False):
        return _compare_main(args)
    if getattr(args, "malloc", "tuned") == "default":
        # Every process started from here on inherits it (`protocol.malloc_tuning`).
        from protocol import malloc_tuning
        os.environ[malloc_tuning.SWITCH] = "off"
    try:
        scenarios = scenarios_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scenarios = [s for _ in range(repeat) for s in scenarios]   # round-robin: slow windows fall on all of them
    out_dir = _out_dir(args)
    report: dict[str, Any] = {"machine": {"cpus": mp.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}, "runs": []}
    systems = ["taproot"] + (["rabbitmq", "nats"] if getattr(args, "compare_python", False) else [])
    if args.system:
        systems = [args.system]
    if systems != ["taproot"] and any(s.queues_per_client > 1 for s in scenarios):
        print("error: several queues per client is Taproot-only (the peers' drivers open one connection "
              "per queue); run those scenarios without --compare", file=sys.stderr)
        return 2
    if systems != ["taproot"] and any(s.app_subscriptions for s in scenarios):
        print("error: application subscriptions are Taproot-only; run those scenarios without --compare",
              file=sys.stderr)
        return 2
    peers_needed = [s for s in systems if s != "taproot"]
    if peers_needed:
        from taproot_ops.bench import peers
        try:
            for system in peers_needed:   # before any run: a missing client would end the bench halfway
                peers.prepare(system)
        except peers.PeerSetupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    for system in systems:
        if system == "taproot":
            report["runs"] += _run_taproot(scenarios, args, out_dir)
        else:
            from taproot_ops.bench import peers
            with peers.server(system) as address:
                report["runs"] += run_system(system, address, scenarios, args, out_dir)
    if len(systems) > 1:
        from taproot_ops.bench.compare import table
        print(table(report["runs"]))
    if repeat > 1:
        report["spread"] = spread(report["runs"])
        for entry in report["spread"]:
            print(fmt_spread(entry), flush=True)
    for target in filter(None, [args.json, out_dir and str(out_dir / "results.json")]):
        with open(target, "w") as fh:
            json.dump(report, fh, indent=1)
    failed = sum(sum(r["failed"].values()) for r in report["runs"])
    return 1 if failed else 0


def _out_dir(args: argparse.Namespace) -> Path | None:
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def _compare_main(args: argparse.Namespace) -> int:
    """`--compare`: the peers with their own tools, then Taproot (compare.py)."""
    chosen = [flag for flag, value in (("--scenario", args.scenario), ("--mode", args.mode), ("--queues", args.queues),
                                       ("--producers", args.producers), ("--consumers", args.consumers),
                                       ("--rate", args.rate), ("--size", args.size), ("--system", args.system),
                                       ("--compare-python", getattr(args, "compare_python", False)))
              if value]
    if chosen:
        print(f"error: --compare runs its own scenarios (1 KiB; one and ten queues, fanout to 5, 10k msg/s), "
              f"so it takes no {chosen[0]}; for BlazingMQ's scenarios beside RabbitMQ and NATS through Python "
              "clients, use --scenario ... --compare-python", file=sys.stderr)
        return 2
    from taproot_ops.bench.compare import run_comparison
    out_dir = _out_dir(args)
    return run_comparison(args, lambda scenarios: _run_taproot(scenarios, args, out_dir), out_dir)


# The flags that shape the embedded cluster `taproot bench` starts: a running
# cluster (--hosts) has its own configuration, and the federation scenarios'
# two clusters run as shipped (`_run_federated` refuses --tls and --auth, and says why).
TREE_FLAGS = (("object_store", "--object-store"), ("spark_cluster", "--spark-cluster"),
              ("no_pipeline", "--no-pipeline"), ("sql_every", "--sql-every"), ("settings", "--set"))
EMBEDDED_ONLY = (("tls", "--tls"), ("auth", "--auth")) + TREE_FLAGS


def _given(args: argparse.Namespace, flags: tuple[tuple[str, str], ...]) -> list[str]:
    return [flag for attr, flag in flags if getattr(args, attr, None)]


def _run_taproot(scenarios: list[Scenario], args: argparse.Namespace, out_dir: Path | None) -> list[dict[str, Any]]:
    if args.hosts:
        ignored = _given(args, EMBEDDED_ONLY + (("data_dir", "--data-dir"),))
        if ignored:
            verb = "shapes" if len(ignored) == 1 else "shape"
            raise SystemExit(f"error: {', '.join(ignored)} {verb} the embedded cluster; --hosts benchmarks a "
                             "running one, as its own configuration has it (drop one or the other)")
    if any(s.federated for s in scenarios):
        ignored = _given(args, TREE_FLAGS)
        if ignored:
            raise SystemExit(f"error: the federation scenarios start their two clusters as shipped; they take "
                             f"no {', '.join(ignored)}")
    if getattr(args, "config", None) and not args.hosts:
        raise SystemExit("error: --config is read with --replay, or with --hosts; an embedded cluster runs the "
                         "shipped cluster.toml with the scenarios' domains (its [pipeline] follows "
                         "--spark-cluster and --no-pipeline; --set SECTION.KEY=VALUE changes one setting)")
    federated = [s for s in scenarios if s.federated]
    if federated:
        if args.hosts:
            raise SystemExit("error: a federation scenario starts its own two clusters; run it without --hosts")
        local = [s for s in scenarios if not s.federated]
        return (_run_taproot(local, args, out_dir) if local else []) + _run_federated(federated, args, out_dir)
    if args.hosts:
        return run_system("taproot", args.hosts[0], scenarios, args, out_dir)
    if getattr(args, "object_store", False) and args.data_dir:
        raise SystemExit("error: --object-store puts the tables in a bucket of its own server; run it without "
                         "--data-dir")
    with_pipeline = not getattr(args, "no_pipeline", False)
    if not with_pipeline and (getattr(args, "spark_cluster", False) or getattr(args, "sql_every", 0.0)):
        raise SystemExit("error: --no-pipeline runs no Spark: it takes neither --spark-cluster nor --sql-every")
    from taproot_ops.embedded import EmbeddedCluster

    settings = list(getattr(args, "settings", None) or [])
    if settings:   # checked before anything is made: a setting that is wrong leaves nothing behind
        with tempfile.TemporaryDirectory(prefix="taproot-bench-settings-") as scratch:
            write_bench_config(Path(scratch), scenarios, settings=settings)
    work = Path(tempfile.mkdtemp(prefix="taproot-bench-"))
    settle(args.data_dir or str(work))
    tls, auth = getattr(args, "tls", False), getattr(args, "auth", False)
    object_store = getattr(args, "object_store", False)
    data_dir = f"s3://{OBJECT_STORE_BUCKET}/bench" if object_store else args.data_dir or str(work / "data")
    # The roles' logs (and TLS and token files): with the tables in the bucket, beside the bench's other files.
    state_dir = str(work / "state") if object_store else data_dir
    security = " and ".join(name for name, on in (("TLS", tls), ("token auth", auth),
                                                  ("no pipeline", not with_pipeline),
                                                  (" ".join(settings), bool(settings))) if on)
    results: list[dict[str, Any]] = []
    engines = contextlib.ExitStack()
    try:
        extra, pipeline, engine_pids = _engines(engines, args, work)
        config = write_bench_config(work / "conf", scenarios, tls=tls, auth=auth, extra=extra, pipeline=pipeline,
                                    settings=settings)
        print(f"starting an embedded cluster in {data_dir}" + (f" with {security}" if security else "") + " ...",
              flush=True)
        with EmbeddedCluster(str(config), data_dir, ephemeral_ports=True, with_pipeline=with_pipeline,
                             state_dir=state_dir) as cluster:
            # The load generator's processes find the CA and the token here
            # (`ClientTls.from_env`, `protocol.auth.token_from_env`).
            os.environ.update(cluster.client_env())
            _warm_up(cluster.client_address, scenarios, args)
            from taproot_ops.bench.cpu import tree_cpu_seconds, tree_rss_mb
            from taproot_ops.bench.phases import node_urls
            from taproot_ops.bench.phases import scrape as scrape_phases
            nodes = node_urls(cluster)

            def pids() -> dict[str, int]:
                return {**{name: p.popen.pid for name, p in cluster.processes.items()}, **engine_pids}

            with SqlLoad(cluster.connect_url, getattr(args, "sql_every", 0.0), cluster.connect_token) as sql:
                results = run_system("taproot", cluster.client_address, scenarios, args, out_dir,
                                     lambda: tree_cpu_seconds(pids()), lambda: tree_rss_mb(pids()),
                                     cluster if with_pipeline else None,
                                     phase_probe=lambda: scrape_phases(nodes))
            for r in results:
                r["pipeline"] = with_pipeline
                if settings:
                    r["settings"] = settings
            if sql.times_s:
                for r in results:
                    r["sql_load"] = sql.summary()
            return results
    finally:
        engines.close()
        logs = os.path.join(state_dir, "logs")
        _tidy(work, results, f"the cluster's logs are in {logs}" if os.path.isdir(logs) else "")


OBJECT_STORE_BUCKET = "taproot"


class SqlLoad:
    """`--sql-every S`: while the scenarios run, `taproot sql` asks the
    pipeline's Spark Connect endpoint for `taproot_backlog` every S seconds,
    as a data team would, to see what sharing the pipeline's Spark costs the
    pipeline (its authority lag, printed per run) and what the queries take."""

    QUERY = "SELECT * FROM taproot_backlog"

    def __init__(self, url: str | None, every_s: float, token: str | None = None):
        import threading
        self.url, self.every_s = url, every_s
        self.env = {**os.environ, **({conf.CONNECT_TOKEN_ENV: token} if token else {})}
        self.times_s: list[float] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SqlLoad":
        if self.every_s > 0:
            if self.url is None:
                raise SystemExit("error: --sql-every needs the pipeline's Spark Connect endpoint ([pipeline] "
                                 "connect_port is -1)")
            print(f"a Spark Connect client queries {self.url} every {self.every_s:g} s ...", flush=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=120)
        if self.times_s:
            said = self.summary()
            print(f"         taproot sql during the runs: {said['queries']} queries ({said['failed']} failed), "
                  f"p50 {said['p50_s']:.2f} s, max {said['max_s']:.2f} s each", flush=True)

    def _run(self) -> None:
        import subprocess
        import time
        while not self.stop.wait(self.every_s):
            started = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "sql", "--remote", str(self.url),
                                  "--json", self.QUERY], capture_output=True, text=True, timeout=300,
                                 env=self.env)
            if out.returncode == 0:
                self.times_s.append(time.monotonic() - started)
            else:
                self.failed += 1

    def summary(self) -> dict[str, Any]:
        import statistics
        return {"every_s": self.every_s, "queries": len(self.times_s), "failed": self.failed,
                "p50_s": statistics.median(self.times_s), "max_s": max(self.times_s)}


def _engines(stack: contextlib.ExitStack, args: argparse.Namespace,
             work: Path) -> tuple[str, dict[str, str], dict[str, int]]:
    """`--object-store`: SeaweedFS on loopback holds the tables; `--spark-cluster`:
    a Spark standalone master and worker (both cores) run the pipeline's
    executor. Returns the cluster.toml sections to append, the [pipeline]
    settings, and the engines' processes, whose CPU counts as the server's
    (the executor is the worker's child)."""
    extra, pipeline, pids = "", {}, {}
    env: dict[str, str] = {}
    if getattr(args, "object_store", False):
        from taproot_ops.object_store import SeaweedFS
        print("starting SeaweedFS (the object store) on loopback ...", flush=True)
        store = stack.enter_context(SeaweedFS(work / "s3", bucket=OBJECT_STORE_BUCKET))
        store.use_in_this_process()      # the roles and this process's authority probe reach it
        extra = f'\n[storage]\nendpoint = "{store.endpoint}"\nallow_http = true\n'
        env = store.env
        assert store.process is not None
        pids["s3"] = store.process.pid
    if getattr(args, "spark_cluster", False):
        from taproot_ops.spark_standalone import SparkStandalone
        print("starting a Spark standalone master and worker on loopback ...", flush=True)
        spark = stack.enter_context(SparkStandalone(work / "spark", workers=1, cores=mp.cpu_count(), memory="3g",
                                                    env=env))
        pipeline = {"spark_master": f'"{spark.master_url}"', "executor_memory": '"2g"',
                    "executor_cores": str(mp.cpu_count()), "max_cores": str(mp.cpu_count())}
        pids.update({f"spark-{i}": p.pid for i, p in enumerate(spark.processes)})
    return extra, pipeline, pids


def _run_federated(scenarios: list[Scenario], args: argparse.Namespace,
                   out_dir: Path | None) -> list[dict[str, Any]]:
    """Two embedded clusters, each with its node, proxy and pipeline: "paris"
    (the consumers connect there) first, then "london" (the producers),
    whose push link carries the scenarios' domains to paris. Plaintext: each
    embedded cluster would make a CA of its own, and a link trusts its own
    cluster's CA only."""
    if getattr(args, "tls", False) or getattr(args, "auth", False):
        raise SystemExit("error: the federation scenarios run without --tls and --auth (two throwaway CAs, "
                         "two clusters' tokens)")
    from taproot_ops.bench.taproot_driver import domain_name
    from taproot_ops.embedded import EmbeddedCluster

    work = Path(tempfile.mkdtemp(prefix="taproot-bench-"))
    settle(args.data_dir or str(work))
    data_root = Path(args.data_dir) if args.data_dir else work / "data"
    results: list[dict[str, Any]] = []
    try:
        print(f"starting two embedded clusters, paris and london, in {data_root} ...", flush=True)
        paris_conf = write_bench_config(work / "paris", scenarios, name="paris")
        with EmbeddedCluster(str(paris_conf), str(data_root / "paris"), ephemeral_ports=True) as paris:
            domains = sorted({domain_name(s) for s in scenarios})
            link = ("\n[[links]]\nname = \"to-paris\"\ncluster = \"paris\"\n"
                    f"hosts = [\"{paris.client_address}\"]\n"
                    "domains = [" + ", ".join(f'"{d}"' for d in domains) + "]\nforward = \"all\"\n")
            london_conf = write_bench_config(work / "london", scenarios, name="london", extra=link)
            with EmbeddedCluster(str(london_conf), str(data_root / "london"), ephemeral_ports=True) as london:
                _warm_up(london.client_address, scenarios, args, consumer_address=paris.client_address)
                from taproot_ops.bench.cpu import tree_cpu_seconds, tree_rss_mb
                from taproot_ops.bench.phases import node_urls
                from taproot_ops.bench.phases import scrape as scrape_phases
                nodes = node_urls(london)   # the producers' PUTs are committed and ACKed in london

                def pids() -> dict[str, int]:
                    return {f"{side}-{name}": p.popen.pid for side, c in (("london", london), ("paris", paris))
                            for name, p in c.processes.items()}

                results = run_system("taproot", london.client_address, scenarios, args, out_dir,
                                     lambda: tree_cpu_seconds(pids()), lambda: tree_rss_mb(pids()), london,
                                     consumer_address=paris.client_address,
                                     phase_probe=lambda: scrape_phases(nodes))
                return results
    finally:
        _tidy(work, results, f"the clusters' logs are in {data_root}/*/logs")


def _tidy(work: Path, results: list[dict[str, Any]], logs: str) -> None:
    """The bench's temp dir goes unless something failed: then its logs are what to read."""
    if results and not any(sum(r["failed"].values()) for r in results):
        tidy(work)
    else:
        print(f"kept {work}" + (f" ({logs})" if logs else ""), flush=True)


def _warm_up(address: str, scenarios: list[Scenario], args: argparse.Namespace,
             consumer_address: str | None = None) -> None:
    """A few seconds of traffic per mode first: Spark's first micro-batches
    compile and load classes, which no steady state pays."""
    from taproot_ops.bench.runner import run

    for mode in dict.fromkeys(s.mode for s in scenarios):
        print(f"warm-up ({mode}) ...", flush=True)
        first = next(s for s in scenarios if s.mode == mode)  # its domain exists in the bench config
        warm = first.with_(name=f"warmup-{mode}", queues=1, rate=2000, duration_s=3)
        run("taproot", address, warm, workers=1, drain_idle_s=60, progress=False, consumer_address=consumer_address)


def _pipeline_main(args: argparse.Namespace) -> int:
    from taproot_ops.bench.pipeline import pipeline_cost, print_pipeline_cost

    return _pipeline_alone(lambda: pipeline_cost(args.pipeline, args.batch or 1000, args.size or 1024),
                           print_pipeline_cost, args.json)


def _history_main(args: argparse.Namespace) -> int:
    from taproot_ops.bench.pipeline import history_cost, print_history_cost

    return _pipeline_alone(lambda: history_cost(args.history, args.batch or 10_000, args.per_batch, args.size or 16),
                           print_history_cost, args.json)


def _pipeline_alone(measure: Callable[[], dict[str, Any]], show: Callable[[dict[str, Any]], None],
                    json_path: str | None) -> int:
    """`--pipeline` and `--history`: run, print, and write the JSON if asked;
    a bad size is exit 2 with its message."""
    try:
        result = measure()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    show(result)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


def _replay_main(args: argparse.Namespace) -> int:
    import conf
    from taproot_ops.bench.replay import replay_scenario

    size = args.size or 32
    if args.hosts:
        if not args.data_dir:
            print("error: --replay with --hosts needs the cluster's --data-dir", file=sys.stderr)
            return 2
        config = conf.load(args.config, data_dir=args.data_dir)
        result = replay_scenario(args.hosts[0], os.path.abspath(config.data_dir), config.partitions,
                                 "taproot://bench/history", args.replay, size)
    else:
        from taproot_ops.embedded import EmbeddedCluster
        data_dir = args.data_dir or tempfile.mkdtemp(prefix="taproot-bench-")
        print(f"starting an embedded cluster in {data_dir} ...", flush=True)
        with EmbeddedCluster(args.config, data_dir, ephemeral_ports=True) as cluster:
            os.environ.update(cluster.client_env())   # its TLS and token, as shipped, for the SDK here
            result = replay_scenario(cluster.client_address, cluster.data_dir, cluster.config.partitions,
                                     "taproot://bench/history", args.replay, size,
                                     conf.with_connect_token(cluster.connect_url, cluster.connect_token)
                                     if cluster.connect_url else None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0
