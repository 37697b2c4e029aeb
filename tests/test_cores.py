"""Batching, GUIDs, group-commit policy, URIs, properties, status mapping, config."""

import sys
import threading
import time

import pytest

import conf
from primary.group_commit import CpuLoad, GroupCommitter, GroupPolicy
from protocol import ResultCode, parse_queue_uri, pb
from protocol.properties import from_wire, maps_to_wire, to_wire, validate_wire, wire_to_maps
from taproot import errors
from taproot.batching import Batcher, BatchPolicy
from taproot.guid import GUID_LENGTH, GuidGenerator


def test_batcher_flushes_on_count_bytes_and_linger():
    b = Batcher(BatchPolicy(linger_ms=5, max_messages=3, max_bytes=100))
    assert not b.add("a", 10, now_ms=0)
    assert not b.due(4)
    assert b.due(5)
    assert not b.add("b", 10, now_ms=1)
    assert b.add("c", 10, now_ms=2)  # third message fills it
    assert b.take() == ["a", "b", "c"] and b.deadline_ms() is None
    assert b.add("big", 100, now_ms=10)  # bytes bound
    with pytest.raises(ValueError):
        BatchPolicy(max_messages=0)


def test_guids_are_16_bytes_unique_and_increasing_even_when_the_clock_stalls():
    gen = GuidGenerator(clock_ns=lambda: 1000, node_id=b"\x01" * 8)
    guids = [gen.next() for _ in range(1000)]
    assert all(len(g) == GUID_LENGTH for g in guids)
    assert len(set(guids)) == 1000
    assert guids == sorted(guids)
    other = GuidGenerator(clock_ns=lambda: 1000, node_id=b"\x02" * 8)
    assert not set(guids) & {other.next() for _ in range(1000)}


def test_next_many_continues_the_same_sequence_as_next():
    clock = iter([1000, 1000, 999])
    gen = GuidGenerator(clock_ns=lambda: next(clock), node_id=b"\x07" * 8)
    one = gen.next()
    many = gen.next_many(3)
    after = gen.next()
    batch = [many[i:i + GUID_LENGTH] for i in range(0, len(many), GUID_LENGTH)]
    assert [one] + batch + [after] == [(1000 + i).to_bytes(8, "big") + b"\x07" * 8 for i in range(5)]
    assert gen.next_many(0) == b""


def test_group_policy():
    policy = GroupPolicy(max_items=10, max_bytes=1000, linger_ms=2)
    assert not policy.should_commit(0, 0, 100)
    assert not policy.should_commit(1, 10, 1)
    assert policy.should_commit(1, 10, 2)
    assert policy.should_commit(10, 10, 0)
    assert policy.should_commit(1, 1000, 0)
    eager = GroupPolicy(max_items=1000, max_bytes=1 << 20, linger_ms=2, eager_items=256)
    assert not eager.should_commit(255, 255 * 1024, 1)   # lingers, as without eager_items
    assert eager.should_commit(255, 255 * 1024, 2)
    assert eager.should_commit(256, 256 * 1024, 0)       # a frame's worth: at once


def test_group_committer_commits_everything_and_bounds_pending():
    committed: list[list[int]] = []
    gate = threading.Event()

    def commit(items):
        gate.wait(5)
        committed.append(items)

    gc = GroupCommitter("t", commit, GroupPolicy(1000, 1 << 20, 0), pending_max=5)
    gc.start()
    assert gc.submit([1], 1)
    # While the first commit is blocked, the next group builds up to the bound.
    import time
    time.sleep(0.05)
    assert gc.submit([2, 3, 4], 3)
    assert not gc.submit([5, 6, 7], 3)  # 3 + 3 > 5: refused, caller NACKs
    gate.set()
    gc.stop()
    assert [i for group in committed for i in group] == [1, 2, 3, 4]


def test_group_policy_lingers_longer_when_busy():
    policy = GroupPolicy(max_items=1000, max_bytes=1 << 20, linger_ms=2, eager_items=256, busy_linger_ms=20)
    assert policy.linger(False) == 2 and policy.linger(True) == 20
    assert policy.should_commit(1, 10, 2) and not policy.should_commit(1, 10, 2, busy=True)
    assert policy.should_commit(1, 10, 20, busy=True)
    assert policy.should_commit(256, 256 * 1024, 0, busy=True)          # a frame's worth: at once, busy or not
    assert GroupPolicy(1000, 1 << 20, 100, busy_linger_ms=20).linger(True) == 100   # never shorter


def test_cpu_load_is_busy_from_three_quarters_of_a_core_until_under_a_half():
    wall, cpu = [0.0], [0.0]
    load = CpuLoad(cpu_s=lambda: cpu[0], wall_s=lambda: wall[0])

    def spend(share: float, seconds: float = 1.0) -> bool:
        wall[0] += seconds
        cpu[0] += share * seconds
        return load.busy()

    assert not spend(0.7)
    assert spend(0.8)
    assert spend(0.6)            # stays busy above the lower mark
    assert not spend(0.4)
    assert not spend(0.6)        # and is not busy again until the upper one
    wall[0] += 0.1
    cpu[0] += 0.1                # a full core, but for less than a window: not judged yet
    assert not load.busy()
    assert spend(0.9, 0.4)       # that window closes at 0.5 s: 0.46 s of CPU
    assert not spend(0.0, 30.0)  # a long quiet spell


class _Load:
    def __init__(self, busy: bool):
        self.value = busy

    def busy(self) -> bool:
        return self.value


@pytest.mark.parametrize("busy", [True, False])
def test_a_busy_committer_lingers_only_for_items_that_came_during_a_commit(busy):
    """Busy, a group begun while a commit ran waits for company (here until
    eager_items arrive); a group begun with nothing in flight (the next PUT
    of a producer waiting for each ACK) does not. Not busy, neither waits."""
    committed: list[list[int]] = []
    gate = threading.Event()
    done = threading.Condition()

    def commit(items):
        if items == [1]:
            gate.wait(5)
        with done:
            committed.append(items)
            done.notify_all()

    def wait_for(n: int) -> None:
        with done:
            assert done.wait_for(lambda: len(committed) >= n, timeout=10), committed

    policy = GroupPolicy(1000, 1 << 20, linger_ms=0, eager_items=2, busy_linger_ms=10_000)
    gc = GroupCommitter("t", commit, policy, pending_max=100, load=_Load(busy))
    gc.start()
    try:
        assert gc.submit([1], 1)
        time.sleep(0.05)
        assert gc.submit([2], 1)      # while [1] is being committed
        gate.set()
        wait_for(2 if not busy else 1)
        time.sleep(0.1)
        assert gc.submit([3], 1)
        wait_for(3 if not busy else 2)
        assert committed == ([[1], [2], [3]] if not busy else [[1], [2, 3]])
        assert gc.linger_ms == (10_000 if busy else 0)
        with done:
            assert done.wait_for(lambda: gc.idle, timeout=10)
        assert gc.submit([4], 1)      # nothing in flight: no linger, busy or not
        wait_for(len(committed) + 1)
        assert committed[-1] == [4] and gc.linger_ms == 0
    finally:
        gate.set()
        gc.stop()


@pytest.mark.parametrize("uri,reason", [
    ("taproot://demo/q", None),
    ("taproot://demo/q?id=app1", None),
    ("bmq://demo/q", "must start with"),
    ("taproot:///q", "domain must match"),
    ("taproot://demo/", "queue name must match"),
    ("taproot://demo/" + "q" * 65, "longer than 64"),
    ("taproot://demo/q?foo=1", "unknown option"),
    ("taproot://demo/q#frag", "fragments"),
    ("", "empty"),
])
def test_queue_uri_validation(uri, reason):
    result = parse_queue_uri(uri)
    if reason is None:
        assert not isinstance(result, str)
        assert result.canonical == uri.split("?")[0]
    else:
        assert isinstance(result, str) and reason in result


def test_properties_round_trip_through_wire_and_table_maps():
    props = {"flag": True, "n": 7, "big": 2**40, "s": "EU", "raw": b"\x00\x01"}
    wire = to_wire(props)
    assert validate_wire(wire) is None
    assert from_wire(wire) == props
    values, types = wire_to_maps(wire)
    assert dict(types) == {"flag": "bool", "n": "int32", "big": "int64", "s": "string", "raw": "binary"}
    assert from_wire(maps_to_wire(values, types)) == props
    with pytest.raises(ValueError):
        to_wire({"_bad": 1})
    with pytest.raises(ValueError):
        to_wire({"x": 2**70})
    assert "given twice" in validate_wire([pb.Property(name="a", int32_value=1), pb.Property(name="a", int32_value=2)])
    with pytest.raises(ValueError, match="at most 255"):
        to_wire({f"p{i}": i for i in range(256)})
    huge = [pb.Property(name="big", binary_value=b"x" * 67_104_746)]
    assert "exceeds 67104745" in validate_wire(huge)


def test_status_codes_map_to_the_most_specific_exception():
    assert isinstance(errors.request_error(ResultCode.INVALID_ARGUMENT, "x"), errors.InvalidArgumentError)
    assert isinstance(errors.request_error(ResultCode.REFUSED, "x"), errors.RefusedError)
    assert isinstance(errors.request_error(ResultCode.TIMEOUT, "x"), errors.TimeoutError)
    generic = errors.request_error(9999, "x")
    assert type(generic) is errors.RequestError and generic.code == ResultCode.UNKNOWN
    assert ResultCode.LIMIT_MESSAGES == 100 and ResultCode.STORAGE_FAILURE == 104  # BlazingMQ values


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(conf.ConfigError, match=r"primary.group_commit_linger_ms: must be between"):
        conf.parse_cluster({"primary": {"group_commit_linger_ms": -1}}, {})
    with pytest.raises(conf.ConfigError, match=r"primary.log_retention_s: must be between 5 and \d+, got 0"):
        conf.parse_cluster({"primary": {"log_retention_s": 0}}, {})
    with pytest.raises(conf.ConfigError, match=r"pipeline.trigger_interval: unknown field"):
        conf.parse_cluster({"pipeline": {"trigger_interval": 5}}, {})
    with pytest.raises(conf.ConfigError, match=r"nodes\[0\].port: expected int"):
        conf.parse_cluster({"nodes": [{"name": "n", "port": "x"}]}, {})
    with pytest.raises(conf.ConfigError, match=r"mode: must be one of"):
        conf.parse_domain("d", {"mode": "lifo"})
    with pytest.raises(conf.ConfigError, match=r"primary.durability: must be one of fsync, os, got 'never'"):
        conf.parse_cluster({"primary": {"durability": "never"}}, {})
    assert conf.parse_cluster({}, {}).primary.durability == "fsync"
    assert conf.parse_cluster({"primary": {"durability": "os"}}, {}).primary.durability == "os"
    (tmp_path / "cluster.toml").write_text("[cluster\nname=")
    with pytest.raises(conf.ConfigError, match="not valid TOML"):
        conf.load(tmp_path / "cluster.toml")
    (tmp_path / "cluster.toml").write_text("[cluster]\npartitions = 2\n")
    (tmp_path / "domains").mkdir()
    (tmp_path / "domains" / "d1.toml").write_text("max_payload_bytes = 0\n")
    with pytest.raises(conf.ConfigError, match=r"d1.toml: max_payload_bytes: must be between"):
        conf.load(tmp_path / "cluster.toml")


def test_a_config_check_reports_every_problem_of_every_file_at_once(tmp_path):
    (tmp_path / "domains").mkdir()
    (tmp_path / "cluster.toml").write_text('[cluster]\npartitons = 2\n[ha]\nlease_duration_ms = "2s"\n'
                                           "[primray]\n[nodes]\n")
    (tmp_path / "domains" / "a.toml").write_text("max_payload_bytes = 0\nqueue_max_mesages = 3\n")
    (tmp_path / "domains" / "b.toml").write_text('mode = "priority\n')
    (tmp_path / "domains" / "c.toml").write_text('mode = "broadcast"\n')           # a good file among them
    with pytest.raises(conf.ConfigError) as raised:
        conf.load(tmp_path)                                                     # the directory that holds it
    cluster, a, b = (str(tmp_path / f) for f in ("cluster.toml", "domains/a.toml", "domains/b.toml"))
    assert raised.value.problems[:4] == [
        f"{cluster}: nodes: must be an array of tables ([[nodes]] sections), got dict {{}}",
        f"{cluster}: primray: unknown section (did you mean 'primary'?)",
        f"{cluster}: cluster.partitons: unknown field (did you mean 'partitions'?)",
        f"{cluster}: ha.lease_duration_ms: expected int, got str '2s'"]
    assert raised.value.problems[4:6] == [
        f"{a}: max_payload_bytes: must be between 1 and 67108864, got 0",
        f"{a}: queue_max_mesages: unknown field (did you mean 'queue_max_messages'?)"]
    [toml] = raised.value.problems[6:]
    assert toml.startswith(f"{b}: not valid TOML: ") and '     1 | mode = "priority\n' in toml
    assert toml.splitlines()[2] == "       |                 ^" and "missing quote" in toml
    # A name nothing is close to lists the names there are.
    with pytest.raises(conf.ConfigError, match=r"cluster.zzz: unknown field \(known: data_dir, name, partitions"):
        conf.parse_cluster({"cluster": {"zzz": 1}}, {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(conf.ConfigError, match="is a directory, not a TOML file, and holds no cluster.toml"):
        conf.load(tmp_path / "empty")


def test_shipped_config_loads():
    config = conf.load()
    assert "demo" in config.domains and config.partitions >= 1


def test_state_dir_keeps_this_machines_files_local_when_the_tables_are_not(tmp_path):
    local = conf.parse_cluster({"cluster": {"data_dir": "/srv/taproot"}, "tls": {"enabled": True, "auto": True},
                                "auth": {"enabled": True, "auto": True}}, {})
    assert local.local_dir == "/srv/taproot"                # the data directory, as before
    assert local.tls.files(local.local_dir)[0] == "/srv/taproot/tls/ca.pem"
    remote = conf.parse_cluster({"cluster": {"data_dir": "s3://bucket/t"}}, {})
    assert remote.local_dir == conf.STATE_DIR_FOR_OBJECT_STORE
    chosen = conf.parse_cluster({"cluster": {"data_dir": "s3://bucket/t", "state_dir": "/var/lib/taproot"}}, {})
    assert chosen.local_dir == "/var/lib/taproot"
    (tmp_path / "domains").mkdir()
    (tmp_path / "cluster.toml").write_text('[cluster]\ndata_dir = "s3://bucket/t"\n')
    loaded = conf.load(tmp_path / "cluster.toml", state_dir="/x")
    assert (loaded.data_dir, loaded.local_dir) == ("s3://bucket/t", "/x")


def test_liveness_heartbeats_each_interval_and_leaves_a_silent_host_once():
    from protocol.liveness import Due, Liveness
    live = Liveness(interval_ms=1000, silence_max_ms=3000)
    live.connected(0)
    assert live.due(500) is Due.NOTHING
    assert live.due(1000) is Due.HEARTBEAT and live.due(1500) is Due.NOTHING
    live.heard(1900)                        # the echo (or any frame) came back
    assert live.due(2000) is Due.HEARTBEAT
    assert live.due(4900) is Due.HEARTBEAT  # 3,000 ms since the last frame: not yet silent too long
    assert live.due(4901) is Due.LEAVE      # and once only
    assert live.due(5000) is Due.NOTHING
    live.connected(6000)                    # the next host
    assert live.due(6500) is Due.NOTHING and live.due(7000) is Due.HEARTBEAT


def test_bare_taproot_says_what_it_can_do_and_version_says_which(capsys):
    from taproot_ops import cli

    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "check-config" in out and "start here:" in out and "taproot run" in out
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("taproot ")


def test_the_cli_shows_payloads_a_terminal_can_take_and_says_why_it_could_not_connect():
    import argparse
    import io

    from taproot_ops import cli

    assert cli._shown(b"order 17 shipped") == "order 17 shipped"
    assert cli._shown(b"\x00\x01\xff\x1b[2J") == "hex:0001ff1b5b324a (7 bytes)"   # no escape reaches a terminal
    assert cli._shown("é".encode() * 100) == "é" * 80 + "... (200 bytes)"
    assert cli._shown(b"\xff" * 50) == "hex:" + "ff" * 40 + "... (50 bytes)"
    said = cli._not_reached(errors.ConnectionError("no host reachable within 1s"), ["10.0.0.5:30115"])
    assert "tried: 10.0.0.5:30115" in said and "Is the cluster running" in said
    assert list(cli._payloads(argparse.Namespace(message=None, count=2))) == [b"message 0", b"message 1"]
    assert list(cli._payloads(argparse.Namespace(message="hi", count=2))) == [b"hi", b"hi"]
    stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(b"a\nb b\r\n\nc"))
    try:
        assert list(cli._payloads(argparse.Namespace(message="-", count=1))) == [b"a", b"b b", b"", b"c"]
    finally:
        sys.stdin = stdin
    with pytest.raises(SystemExit):          # a queue must be named: nothing goes to demo/orders by default
        cli.build_parser().parse_args(["produce", "-m", "x"])


def test_fetching_the_jars_is_tried_again_when_a_resolution_fails(monkeypatch):
    from storage import spark

    calls = []

    class Session:
        def range(self, n):
            return self

        def count(self):
            return 1

        def stop(self):
            calls.append("stopped")

    def session(name, object_store):
        calls.append(object_store)
        if len(calls) < 3:
            raise RuntimeError("[JAVA_GATEWAY_EXITED]")
        return Session()

    monkeypatch.setattr(spark, "_cached_jars", lambda object_store=False: [])
    monkeypatch.setattr(spark, "session", session)
    monkeypatch.setattr(spark.time, "sleep", lambda s: None)
    assert spark.fetch_jars(object_store=True) is True
    assert calls == [True, True, True, "stopped"]
    calls.clear()
    monkeypatch.setattr(spark, "FETCH_ATTEMPTS", 2)
    with pytest.raises(RuntimeError):
        spark.fetch_jars()


def test_taproot_sql_names_the_views_when_a_query_names_one_that_is_not_there():
    from types import SimpleNamespace

    from taproot_ops import cli

    names = ["taproot_puts", "taproot__delivery_0", "taproot_backlog", "other"]
    spark = SimpleNamespace(catalog=SimpleNamespace(listTables=lambda: [SimpleNamespace(name=n) for n in names]))
    said = cli._sql_error(RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table or view `taproot_backlg` cannot be "
                                       "found.\nSQLSTATE: 42P01"), spark)
    assert said.splitlines()[0] == ("error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `taproot_backlg` cannot "
                                    "be found.")
    assert "the views: taproot_backlog, taproot_puts (" in said
    assert cli._sql_error(RuntimeError("[PARSE_SYNTAX_ERROR] at 'SELEC'"), spark) == \
        "error: [PARSE_SYNTAX_ERROR] at 'SELEC'"


def test_the_jvm_archive_is_used_only_when_it_matches_this_jvm_and_these_jars(tmp_path, monkeypatch):
    """`taproot_ops.jvm_archive`: the options name this machine's archive when
    there is one; a changed jar (a pyspark or Delta upgrade) is another key,
    so the old archive is not used."""
    from taproot_ops import jvm_archive

    monkeypatch.setenv("TAPROOT_CACHE_DIR", str(tmp_path))
    jars = tmp_path / "ivy" / "jars"
    jars.mkdir(parents=True)
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"v1")
    assert jvm_archive.archive_options() == ""
    path = jvm_archive.archive_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    options = jvm_archive.archive_options()
    assert f"-XX:SharedArchiveFile={path}" in options and "-Xlog:cds=off" in options
    (jars / "delta-spark_4.2_2.13-4.4.0.jar").write_bytes(b"v2, another size")
    assert jvm_archive.archive_path() != path
    assert jvm_archive.archive_options() == ""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jvm"))   # a JVM it cannot read: no archive, no error
    assert jvm_archive.archive_options() == ""


def test_taproot_sql_reads_with_deltas_kernel_connector_and_runs_a_query_it_fails_the_classic_way(capsys):
    """On the endpoint, a query runs with `spark.databricks.delta.v2.enableMode`
    STRICT in its session; other statements (DESCRIBE HISTORY, DELETE) and
    `--classic-reads` do not; a query the Kernel connector fails is run again
    with it NONE, with a note; errors either connector would give are not."""
    import argparse

    from taproot_ops import cli
    from taproot_ops.sparkconnect.client import ConnectError

    class Endpoint:
        def __init__(self, fails_with: str | None = None):
            self.said: list[str] = []
            self.mode = "NONE"
            self.fails_with = fails_with

        def sql(self, query):
            self.said.append(query)
            self.mode = query.rsplit("=", 1)[1]

        def show(self, query, rows, truncate, vertical):
            self.said.append(f"show {query}")
            if self.fails_with and (self.mode == "STRICT" or "UNRESOLVED" in self.fails_with):
                raise ConnectError("INTERNAL", f"[{self.fails_with}] no")
            return f"rows read with {self.mode}\n"

    def run(query, fails_with=None, classic=False):
        endpoint = Endpoint(fails_with)
        args = argparse.Namespace(query=query, json=False, limit=20, truncate=0, vertical=False,
                                  classic_reads=classic)
        return cli._sql_remote(endpoint, args), endpoint.said, capsys.readouterr()

    rc, said, out = run("  with x AS (SELECT 1) SELECT * FROM x")
    assert rc == 0 and said[0] == f"SET {cli.DELTA_CONNECTOR_MODE}=STRICT" and out.out == "rows read with STRICT\n"
    rc, said, out = run("DESCRIBE HISTORY delta.`/d/partition-000/puts`")
    assert rc == 0 and not any(s.startswith("SET") for s in said) and out.out == "rows read with NONE\n"
    rc, said, out = run("SELECT * FROM taproot_backlog", classic=True)
    assert out.out == "rows read with NONE\n"
    rc, said, out = run("(SELECT * FROM taproot_puts)", fails_with="UNSUPPORTED_FEATURE")
    assert rc == 0 and out.out == "rows read with NONE\n" and said[-2] == f"SET {cli.DELTA_CONNECTOR_MODE}=NONE"
    assert "Kernel connector could not run this query ([UNSUPPORTED_FEATURE] no)" in out.err
    rc, said, out = run("SELECT nope FROM taproot_puts", fails_with="UNRESOLVED_COLUMN")
    assert rc == 2 and len([s for s in said if s.startswith("show")]) == 1 and "Kernel" not in out.err
    assert out.err.startswith("error: [UNRESOLVED_COLUMN] no")
