"""Shared fixtures. Tiers: `unit` (no JVM, no sockets), `integration` (real
processes on loopback, real Delta), `spark` (a JVM). Unmarked tests default to unit."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from taproot_ops import jvm_archive

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every Spark JVM of the suite (and of the roles it starts) with C1 only: they
# live seconds to minutes, and C2's compilations were about 40 % of their CPU
# on 2 cores (`storage.spark.JVM_OPTIONS_ENV`); and with this machine's
# class-data archive of a Spark driver's classes where `make test` made one
# (`taproot_ops.jvm_archive`: 3 s less CPU per JVM start). `make run`'s test clears it.
# C1 alone gets the 48 MB code cache of a JVM without tiers, and the shared
# cluster's pipeline lives the whole session: once (CI, 2026-12-03) it filled
# that in 62 s ("CodeCache is full. Compiler has been disabled"), its tasks
# failed on method-handle intrinsics that no longer fit, and 16 tests that
# waited for its delivery rows timed out. The tiered default, 240 MB, instead.
os.environ.setdefault("TAPROOT_JVM_OPTIONS", f"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m "
                                             f"{jvm_archive.archive_options()}".strip())
# PySpark logs each failed query's whole plan as one JSON line; the exception says it all.
logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="the long tiers: a long fuzz run, every start-up order (make test-long)")
    parser.addoption("--fast", action="store_true", default=False,
                     help="the fast tier's example budget: a third of the suite's for each property test "
                          "(make test-fast; `make test` runs the suite's)")
    parser.addoption("--cpu-report", type=int, default=0, metavar="N",
                     help="print the N tests that kept this machine's cores busiest (CPU seconds of every "
                          "process, from /proc/stat, over each test's set-up, call and tear-down)")


_CPU_SPENT: dict[str, tuple[float, float, float]] = {}   # test id -> (busy CPU s, pytest's own, wall s)


def _busy_cpu_s() -> float:
    """CPU seconds every process of this machine has used since boot (/proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)   # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("--cpu-report"):
        yield
        return
    cpu, own, wall = _busy_cpu_s(), time.process_time(), time.monotonic()
    yield
    _CPU_SPENT[item.nodeid] = (_busy_cpu_s() - cpu, time.process_time() - own, time.monotonic() - wall)


_LOG_OFFSETS = pytest.StashKey[dict]()
_WORTH_SHOWING = re.compile(r"ERROR|Error|Exception|Caused by|Traceback|Could not|FATAL|refused|GOAWAY")


def _role_logs(item) -> dict[str, Path]:
    """The log files of the embedded clusters a test uses (its fixtures'
    values); never raises: the hooks below must not fail a test."""
    logs = {}
    try:
        for value in getattr(item, "funcargs", {}).values():
            processes = getattr(value, "processes", None)
            if not isinstance(processes, dict):   # not an embedded cluster (a standalone Spark's is a list)
                continue
            for name, process in processes.items():
                if isinstance(getattr(process, "log_file", None), Path):
                    logs[name] = process.log_file
    except Exception:   # a fixture value of another kind: nothing to show
        return {}
    return logs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    offsets = {}
    for name, path in _role_logs(item).items():
        with contextlib.suppress(OSError):
            offsets[name] = path.stat().st_size
    item.stash[_LOG_OFFSETS] = offsets
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a cluster (a shared one runs for the whole
    session) reports what its roles logged of errors while it ran: CI keeps
    only pytest's output."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.failed:
        return
    logs = _role_logs(item)
    for name, start in item.stash.get(_LOG_OFFSETS, {}).items():
        path = logs.get(name)
        try:
            with open(path, "rb") as log:
                log.seek(start)
                written = log.read().decode(errors="replace").splitlines()
        except (OSError, TypeError):
            continue
        worth = [line for line in written if _WORTH_SHOWING.search(line)]
        if worth:
            shown = worth[:40] + ([f"... and {len(worth) - 40} more such lines"] if len(worth) > 40 else [])
            report.sections.append((f"{name}'s log while the test ran ({path}): its error lines",
                                    "\n".join(line[:400] for line in shown)))


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("--cpu-report")
    if count and getattr(config.option, "numprocesses", None):
        # The figures are gathered in the workers, and the machine's busy CPU
        # would count both workers' tests in each: only a serial run has them.
        terminalreporter.write_line("--cpu-report: no report on pytest-xdist's workers; run with -n 0")
        return
    if not count or not _CPU_SPENT:
        return
    cpu, own, wall = (sum(spent[i] for spent in _CPU_SPENT.values()) for i in range(3))
    terminalreporter.section(f"CPU: {cpu:.0f} s of busy cores in {wall:.0f} s of tests ({cpu / max(wall, 1e-9):.2f} "
                             f"cores), {own:.0f} s of them pytest's own process; the busiest tests")
    modules: dict[str, list[float]] = {}
    for nodeid, spent in _CPU_SPENT.items():
        module = modules.setdefault(nodeid.split("::")[0], [0.0, 0.0, 0.0])
        for i in range(3):
            module[i] += spent[i]
    terminalreporter.write_line("     CPU  pytest's    wall")
    for name, (c, o, w) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:count]:
        terminalreporter.write_line(f"{c:8.1f}  {o:8.1f}  {w:6.1f} s  {name}")
    terminalreporter.write_line("")
    for nodeid, (c, o, w) in sorted(_CPU_SPENT.items(), key=lambda kv: -kv[1][0])[:count]:
        terminalreporter.write_line(f"{c:8.1f}  {o:8.1f}  {w:6.1f} s  {nodeid}")


def pytest_configure(config):
    # The property and fuzz tests' sizes: a short, derandomized run by
    # default (the same inputs every run, so CI is repeatable); `--long` runs
    # 100 times more, at random; `--fast` (the fast tier, a developer's loop
    # under 30 s on two cores) a third, derandomized too. A test that needs
    # more than others asks for a multiple of its tier's
    # (`max_examples=2 * settings().max_examples`), never a fixed count.
    from hypothesis import settings
    settings.register_profile("fast", max_examples=50, derandomize=True, print_blob=True)
    settings.register_profile("short", max_examples=150, derandomize=True, print_blob=True)
    settings.register_profile("long", max_examples=15_000, print_blob=True)
    settings.load_profile("long" if config.getoption("--long") else "fast" if config.getoption("--fast") else "short")


# `make test` runs the suite on two workers (`-n 2 --dist loadgroup`, with
# the scheduler below): BESIDE's modules on one, every other module on the
# other, each in the order below. BESIDE's modules share no session fixture
# (the shared cluster, the test Spark, the object store), bind no shipped port
# and time nothing against a bound; the JVMs' shared fixtures and the shipped
# ports stay on the other worker, serially. Heaviest first: the two at the
# front start JVMs of their own (a cold pipeline for each start-up order; a
# standalone Spark cluster), about 190 s of the JVM worker's 17 minutes
# before; the rest start no JVM (about 230 s of a serial run, at 150 s of
# CPU). BESIDE's worker is done within minutes; the modules that time
# failovers against bounds (LAST) run at the end of the other worker, so no
# JVM starts beside them. A module missing from both runs with the JVMs'.
BESIDE = ("test_start_order", "test_spark_cluster",
          "test_federation", "test_express_partition", "test_node_parking", "test_disk_full", "test_compaction",
          "test_simulation", "test_tls", "test_auth", "test_fuzz_frames", "test_leases", "test_imports",
          "test_liveness", "test_fuzz_config", "test_express", "test_columns", "test_dispatcher",
          "test_session_core", "test_mirror", "test_spanning_frames", "test_stream", "test_seqs", "test_relay",
          "test_retransmit_deferral", "test_links", "test_durability", "test_property_kinds", "test_put_future",
          "test_quota_and_domains", "test_admission", "test_forwarding", "test_gc_tuning", "test_malloc_tuning",
          "test_console", "test_cores", "test_bench_peers", "test_connect_port", "test_sparkconnect",
          "test_thread_names")
LAST = ("test_faults", "test_hosts")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadgroup`: two work units, BESIDE's modules and the rest.
    (xdist's own loadgroup reads `xdist_group` marks by renaming node ids,
    which pytest 9.2's node ids no longer allow.)"""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "beside" if _module(nodeid) in BESIDE else "jvm"

    return TwoGroups(config, log)


SESSION_FIXTURES = {"cluster", "spark", "object_store"}


def pytest_collection_modifyitems(items):
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("integration", "spark")):
            item.add_marker(pytest.mark.unit)
        if _module(item.nodeid) in BESIDE:   # what would break running beside the JVMs' worker
            shared = SESSION_FIXTURES & set(getattr(item, "fixturenames", ()))
            if shared:
                raise pytest.UsageError(f"{item.nodeid} is in BESIDE (tests/conftest.py) but uses "
                                        f"{', '.join(sorted(shared))}: take its module out of BESIDE")
    rank = {name: i for i, name in enumerate(BESIDE)} | {name: i - len(LAST) for i, name in enumerate(LAST)}
    # Stable: the other modules keep their order, then LAST's, then BESIDE's.
    items.sort(key=lambda item: rank.get(_module(item.nodeid), -len(LAST) - 1))


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (with Delta) for every Spark-tier test; started on first use."""
    from storage import spark as spark_factory
    session = spark_factory.session("taproot-tests")
    yield session
    session.stop()


def spark_offset_entry(reservoir_version: int, index: int = -1, starting: bool = False) -> str:
    """One entry of a Spark streaming checkpoint's offset log (`offsets/N`)
    with a Delta source's offset, as Spark writes it."""
    return ('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n'
            f'{{"sourceVersion":1,"reservoirId":"r","reservoirVersion":{reservoir_version},"index":{index},'
            f'"isStartingVersion":{"true" if starting else "false"}}}')


def link_frames(link, timeout_s: float) -> Iterator[tuple[float, object]]:
    """The frames an in-process node sends on `link` (`protocol.stream.Link`)
    for `timeout_s`, each with the monotonic time it was taken."""
    import queue as _queue

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            frame = link.next_frame(0.05)
        except _queue.Empty:
            continue
        yield time.monotonic(), frame


@contextlib.contextmanager
def serving_node(config, partitions: tuple[int, ...] = (0,)) -> Iterator[tuple[object, object]]:
    """A node of `config` (named node1) in this process, serving
    `partitions`, and a client link opened on it; stopped afterwards."""
    from primary.node import Node
    from protocol.stream import Link

    node = Node(config, "node1")
    node.start("127.0.0.1:1")
    try:
        wait_until(lambda: set(partitions) <= set(node.partitions), 30,
                   what=f"node1 serving partition(s) {', '.join(map(str, partitions))}")
        link = Link("client")
        node.open_link(link)
        yield node, link
    finally:
        node.stop(graceful=False)


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.05, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")


@contextlib.contextmanager
def store_in_this_process(store):
    """A started SeaweedFS that this process's delta-rs (and the processes it
    starts) reach until the block ends (`use_in_this_process`); the
    environment is restored then."""
    saved = dict(os.environ)
    store.use_in_this_process()
    try:
        yield store
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """An S3-compatible server (SeaweedFS, `taproot_ops.object_store`) with
    one bucket on loopback; this process's delta-rs reaches it."""
    from taproot_ops.object_store import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("s3")) as store, store_in_this_process(store):
        yield store


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One embedded cluster for every integration module (starting one costs
    about 50 s on 2 cores). Each test uses queues of its own."""
    # No JIT warm-up: the first tests' batches pay it instead, overlapped with
    # their own work; it saves about 25 s of start-up per run.
    with cluster_from("cluster_conf", tmp_path_factory, warm_up=False) as c:
        yield c


@contextlib.contextmanager
def cluster_from(conf_name: str, tmp_path_factory, warm_up: bool = True, extra: str = "",
                 with_pipeline: bool = True):
    """An embedded cluster (node, proxy, pipeline processes) on a copy of
    tests/<conf_name>, so a test may edit its domain files; `extra` (TOML
    sections) appended to its cluster.toml. `cluster.config_path` is the
    copied cluster.toml."""
    from taproot_ops.embedded import EmbeddedCluster

    conf_dir = tmp_path_factory.mktemp("conf")
    shutil.copytree(Path(__file__).resolve().parent / conf_name, conf_dir, dirs_exist_ok=True)
    cluster_file = conf_dir / "cluster.toml"
    cluster_file.write_text(cluster_file.read_text() + extra)
    with EmbeddedCluster(str(cluster_file), data_dir=str(tmp_path_factory.mktemp("data")),
                         ephemeral_ports=True, warm_up=warm_up, with_pipeline=with_pipeline) as cluster:
        cluster.config_path = conf_dir / "cluster.toml"  # type: ignore[attr-defined]
        yield cluster


def collect(queue, count: int, timeout_s: float = 60, confirm: bool = True) -> list:
    """Up to `count` messages pushed to `queue` within `timeout_s`, each
    confirmed as it arrives unless `confirm` is False."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        message = queue.get(timeout_s=0.5)
        if message is not None:
            got.append(message)
            if confirm:
                queue.confirm(message)
    return got
