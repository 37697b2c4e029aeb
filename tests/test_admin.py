"""`taproot admin` against the shared embedded cluster: every command, its
text and its JSON checked; a purge survives the node's restart; refusals
come with their code."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import conf
from primary.admin import domains_version
from protocol import ResultCode
from taproot_ops import admin
from taproot_ops.cli import main
from tests.conftest import collect, wait_until

pytestmark = pytest.mark.integration


def run_admin(cluster, capsys, *args: str, hosts: list[str] | None = None) -> tuple[int, str, str]:
    code = main(["admin", "--config", str(cluster.config_path),
                 *(f"--host={h}" for h in hosts or [cluster.node_address]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def admin_json(cluster, capsys, *args: str, hosts: list[str] | None = None):
    code, out, err = run_admin(cluster, capsys, "--json", *args, hosts=hosts)
    assert code == 0, err
    return json.loads(out)


def test_status_names_the_leader_of_each_partition_and_the_proxy(cluster, capsys):
    hosts = [cluster.node_address, cluster.proxy_address]
    data = admin_json(cluster, capsys, "status", hosts=hosts)
    node, proxy = data[cluster.node_address], data[cluster.proxy_address]
    assert node["role"] == "node" and node["name"] == "node1" and node["cluster"] == "test"
    [partition] = node["partitions"]
    assert partition["here"] and partition["leader"] == "node1" and partition["epoch"] >= 1
    assert partition["authority_lag_s"] >= 0 and partition["leader_address"] == cluster.node_address
    assert proxy["role"] == "proxy" and proxy["connected"] and proxy["upstream"] == cluster.node_address
    assert proxy["retransmission_buffer"] == {"messages": 0, "bytes": 0}

    code, out, _ = run_admin(cluster, capsys, "status", hosts=hosts)
    assert code == 0
    assert "cluster test" in out
    assert "node, up" in out and "leads partition(s) 0" in out
    assert "proxy, up" in out and f"connected to {cluster.node_address}" in out
    line = next(line for line in out.splitlines() if line.split()[:2] == ["0", "node1"])
    assert int(line.split()[2]) == partition["epoch"]


def test_domains_shows_the_live_configuration_and_its_version(cluster, capsys):
    expected = conf.load(str(cluster.config_path)).domains
    data = admin_json(cluster, capsys, "domains")
    reply = data["node1"] if "node1" in data else data[cluster.node_address]
    assert reply["version"] == domains_version(expected)
    assert reply["domains"]["fan"]["mode"] == "fanout"
    assert reply["domains"]["fan"]["app_ids"] == ["billing", "audit", "eu"]
    code, out, _ = run_admin(cluster, capsys, "domains")
    assert code == 0 and f"domains version {reply['version']}" in out
    assert any(line.split()[:3] == ["fan", "fanout", "express"] for line in out.splitlines())


def test_queues_and_queue_show_depth_consumers_and_the_oldest_waiting_message(cluster, capsys):
    from taproot import Session

    name = f"admin-{uuid.uuid4().hex[:8]}"
    uri = f"taproot://demo/{name}"
    with Session([cluster.proxy_address]) as session:
        writer = session.open_queue(uri, write=True)
        reader = session.open_queue(uri, read=True, max_unconfirmed_messages=4, consumer_priority=3,
                                    subscription="n >= 0")
        admin_json(cluster, capsys, "queues", "--domain", "demo")        # a first sample for the rates
        for i in range(10):
            writer.post(f"m{i}".encode(), {"n": i}).result(30)
        held = collect(reader, 4, timeout_s=30, confirm=False)
        assert len(held) == 4
        time.sleep(1.1)
        data = admin_json(cluster, capsys, "queues", "--domain", "demo")
        [row] = [q for q in data["queues"] if q["queue"] == name]
        assert (row["uri"], row["partition"], row["mode"]) == (uri, 0, "priority")
        assert (row["consumers"], row["producers"], row["puts"]) == (1, 1, 10)
        [app] = row["apps"]
        assert (app["app"], app["depth"], app["unconfirmed"], app["pushed"], app["confirmed"]) == ("", 10, 4, 4, 0)
        assert 0 < row["puts_per_s"] <= 10 / 1.1 and 0 < app["pushes_per_s"] <= 4 / 1.1

        code, out, _ = run_admin(cluster, capsys, "queues", "--domain", "demo")
        assert code == 0
        line = next(line for line in out.splitlines() if line.startswith(uri))
        assert line.split()[1:8] == ["0", "priority", "1", "1", "-", "10", "4"]

        detail = admin_json(cluster, capsys, "queue", uri)
        assert detail["uri"] == uri and detail["partition"] == 0
        [app] = detail["apps"]
        assert (app["waiting"], app["unconfirmed"]) == (6, 4)
        [consumer] = app["consumers"]
        assert (consumer["priority"], consumer["subscriptions"], consumer["max_unconfirmed_messages"],
                consumer["unconfirmed_messages"], consumer["paused"]) == (3, ["n >= 0"], 4, 4, False)
        oldest = app["oldest_waiting"]
        assert oldest["seq"] == held[-1].sequence + 1 and oldest["delivery_count"] == 0 and oldest["age_s"] >= 0
        code, out, _ = run_admin(cluster, capsys, "queue", uri)
        assert code == 0 and "6 waiting, 4 unconfirmed" in out and "priority 3, n >= 0, 4/4 unconfirmed" in out
        for message in held:
            reader.confirm(message)


def test_a_purge_is_recorded_and_survives_a_restart(cluster, capsys):
    from taproot import Session

    name = f"purge-{uuid.uuid4().hex[:8]}"
    uri = f"taproot://demo/{name}"
    with Session([cluster.proxy_address]) as session:
        writer = session.open_queue(uri, write=True)
        reader = session.open_queue(uri, read=True, max_unconfirmed_messages=3)
        for i in range(8):
            writer.post(f"old{i}".encode()).result(30)
        held = collect(reader, 3, timeout_s=30, confirm=False)
        assert len(held) == 3

        code, _, err = run_admin(cluster, capsys, "purge", uri)
        assert code == 2 and "Add --yes" in err
        assert admin_json(cluster, capsys, "queue", uri)["apps"][0]["waiting"] == 5    # nothing happened

        data = admin_json(cluster, capsys, "purge", uri, "--yes")
        assert data["purged"] == {"": 8} and data["total"] == 8
        [app] = admin_json(cluster, capsys, "queue", uri)["apps"]
        assert (app["waiting"], app["unconfirmed"], app["oldest_waiting"]) == (0, 0, None)
        for message in held:
            reader.confirm(message)              # ignored: they are gone
        writer.post(b"new").result(30)
        [after] = collect(reader, 1, timeout_s=30)
        assert after.payload == b"new"

    cluster.restart_node()
    with Session([cluster.proxy_address]) as session:
        reader = session.open_queue(uri, read=True)
        session.open_queue(uri, write=True).post(b"after the restart").result(60)
        # Recovery dispatches what it brings back before anything newer: the
        # first message is the new one, so neither the purged nor the
        # confirmed came back.
        [first] = collect(reader, 1, timeout_s=60)
        assert first.payload == b"after the restart"
        assert collect(reader, 1, timeout_s=2) == []


def test_purging_one_app_of_a_fanout_queue_leaves_the_others(cluster, capsys):
    from taproot import Session

    name = f"purge-{uuid.uuid4().hex[:8]}"
    uri = f"taproot://fan/{name}"
    with Session([cluster.proxy_address]) as session:
        writer = session.open_queue(uri, write=True)
        for i in range(5):
            writer.post(f"m{i}".encode(), {"region": "EU"}).result(30)
        wait_until(lambda: sum(a["depth"] for q in admin_json(cluster, capsys, "queues", "--domain", "fan")["queues"]
                               if q["queue"] == name for a in q["apps"]) == 15, 30, what="5 messages for 3 apps")
        data = admin_json(cluster, capsys, "purge", uri, "--app", "audit", "--yes")
        assert data["purged"] == {"audit": 5}
        [row] = [q for q in admin_json(cluster, capsys, "queues", "--domain", "fan")["queues"] if q["queue"] == name]
        assert {a["app"]: a["depth"] for a in row["apps"]} == {"audit": 0, "billing": 5, "eu": 5}
        billing = session.open_queue(f"{uri}?id=billing", read=True)
        assert len(collect(billing, 5, timeout_s=30)) == 5


def test_refusals_have_a_code_and_say_why(cluster, capsys):
    missing = f"taproot://demo/never-{uuid.uuid4().hex[:8]}"
    cases = [
        (("queue", missing), "INVALID_ARGUMENT", "no such queue"),
        (("queue", "http://demo/x"), "INVALID_ARGUMENT", "must start with 'taproot://'"),
        (("purge", "taproot://fan/x", "--app", "nope", "--yes"), "INVALID_ARGUMENT", None),
        (("queues", "--domain", "nope"), "INVALID_ARGUMENT", "no domain 'nope'"),
    ]
    for args, code_name, says in cases:
        code, out, err = run_admin(cluster, capsys, *args)
        assert code == 1, (args, out, err)
        assert code_name in err and (says is None or says in err), err
    # A proxy has no queues: it says which commands it answers.
    answer = admin.call(cluster.proxy_address, "queues")
    assert answer.code == ResultCode.INVALID_ARGUMENT and "a proxy answers: status, stop" in answer.message
    # Nobody there.
    code, out, _ = run_admin(cluster, capsys, "status", hosts=["127.0.0.1:1"])
    assert code == 1 and "NOT_CONNECTED: unreachable" in out
    code, _, err = run_admin(cluster, capsys, "stop", "nobody")
    assert code == 2 and "no node or proxy named 'nobody'" in err


def test_stop_drains_a_proxy_and_it_exits(cluster, capsys):
    process = cluster.start_proxy(name="admin-proxy", hosts=[cluster.node_address])
    address = cluster.proxy_addresses.pop("admin-proxy")
    cluster.processes.pop("admin-proxy")
    try:
        code, out, _ = run_admin(cluster, capsys, "stop", address)
        assert code == 0 and "stopping (StopRequest to its clients" in out
        assert process.popen.wait(30) == 0
    finally:
        if process.popen.poll() is None:   # the test failed: leave no proxy behind
            process.popen.kill()
            process.popen.wait(10)
