"""Federation (docs/federation.md): two clusters on this machine, each a node
and a proxy in processes of their own, two configs, two data directories,
two port ranges. London pushes domain `demo` to Paris (`all`) and Paris
pushes it back (a loop the `taproot.via` property breaks); London pushes
`events` to Paris for what no local subscription takes (`unmatched`); `rpc`
goes both ways for `queue@cluster` only (request/response); each pulls
`feeds` from the other while it has consumers. Neither runs a pipeline: links
read the PUT log or consume, and the express lane delivers."""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

import pytest

from protocol import ResultCode
from taproot_ops.embedded import EmbeddedCluster
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

DOMAINS = {
    "demo.toml": 'mode = "priority"\n',
    "events.toml": 'mode = "priority"\n[subscriptions]\n"" = "region = \'EU\'"\n',
    "rpc.toml": 'mode = "priority"\n',
    "feeds.toml": 'mode = "priority"\n',
}


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_conf(directory: Path, name: str, node_port: int, proxy_port: int, links: str) -> Path:
    (directory / "domains").mkdir(parents=True)
    for file, text in DOMAINS.items():
        (directory / "domains" / file).write_text(text)
    config = directory / "cluster.toml"
    config.write_text(textwrap.dedent(f"""\
        [cluster]
        name = "{name}"

        [[nodes]]
        name = "node1"
        port = {node_port}
        http_port = 0

        [[proxies]]
        name = "proxy1"
        port = {proxy_port}
        upstream = "node1"
        http_port = 0

        [maintenance]
        interval_s = 0
        """) + textwrap.dedent(links))
    return config


def link(name: str, cluster: str, port: int, domains: list[str], forward: str = "") -> str:
    """A push link with `forward`, or a pull link without."""
    way = f'forward = "{forward}"' if forward else 'direction = "pull"'
    return (f'\n[[links]]\nname = "{name}"\ncluster = "{cluster}"\nhosts = ["127.0.0.1:{port}"]\n'
            f'domains = {domains!r}\n{way}\nretry_interval_ms = 200\n').replace("'", '"')


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    london_node, london_proxy, paris_node, paris_proxy = free_ports(4)
    base = tmp_path_factory.mktemp("federation")
    london_conf = write_conf(base / "london", "london", london_node, london_proxy,
                             link("demo-to-paris", "paris", paris_proxy, ["demo"], "all")
                             + link("events-to-paris", "paris", paris_proxy, ["events"], "unmatched")
                             + link("rpc-to-paris", "paris", paris_proxy, ["rpc"], "none")
                             + link("feeds-from-paris", "paris", paris_proxy, ["feeds"]))
    paris_conf = write_conf(base / "paris", "paris", paris_node, paris_proxy,
                            link("demo-to-london", "london", london_proxy, ["demo"], "all")
                            + link("rpc-to-london", "london", london_proxy, ["rpc"], "none")
                            + link("feeds-from-london", "london", london_proxy, ["feeds"]))
    with EmbeddedCluster(str(paris_conf), data_dir=str(base / "paris-data"), with_pipeline=False) as paris, \
            EmbeddedCluster(str(london_conf), data_dir=str(base / "london-data"), with_pipeline=False) as london:
        yield london, paris


def drain(queue, expect: int, timeout_s: float = 60, quiet_s: float = 2.0) -> list:
    """Every message pushed to `queue` until `expect` came and then nothing
    for `quiet_s` (so a copy too many shows), each confirmed."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = queue.get(timeout_s=quiet_s if len(got) >= expect else 0.5)
        if message is None:
            if len(got) >= expect:
                break
            continue
        got.append(message)
        queue.confirm(message)
    return got


def test_push_all_delivers_here_and_there_once_and_does_not_loop(clusters):
    from taproot import Session

    london, paris = clusters
    uri = "taproot://demo/orders"
    with Session([london.proxy_address]) as here, Session([paris.proxy_address]) as there:
        local = here.open_queue(uri, read=True)
        remote = there.open_queue(uri, read=True)
        producer = here.open_queue(uri, write=True)
        guids = [f.result(timeout=30).guid for f in [producer.post(b"%04d" % i) for i in range(300)]]
        got_there = drain(remote, len(guids))
        got_here = drain(local, len(guids))
    assert [m.guid for m in got_here] == guids              # delivered here, once: Paris's copy back was dropped
    assert [m.guid for m in got_there] == guids             # forwarded once, in PUT order
    assert {m.properties.get("taproot.via") for m in got_there} == {"london"}


def test_push_unmatched_forwards_what_no_local_subscription_takes(clusters):
    from taproot import Session

    london, paris = clusters
    uri = "taproot://events/clicks"
    with Session([london.proxy_address]) as here, Session([paris.proxy_address]) as there:
        local = here.open_queue(uri, read=True)
        remote = there.open_queue(uri, read=True)
        producer = here.open_queue(uri, write=True)
        regions = ["EU", "US", "EU", "APAC", "US", "EU"] * 20
        futures = [producer.post(b"x", properties={"region": r, "i": i}) for i, r in enumerate(regions)]
        guids = [f.result(timeout=30).guid for f in futures]
        eu = [g for g, r in zip(guids, regions) if r == "EU"]
        elsewhere = [g for g, r in zip(guids, regions) if r != "EU"]
        got_here = drain(local, len(eu))
        # Paris has the same subscription on `events`: what London forwards
        # (not EU) no app takes there either, so it is stored and never pushed.
        assert remote.get(timeout_s=3) is None
    assert [m.guid for m in got_here] == eu
    assert elsewhere and paris_put_rows(paris, "events", "clicks") == len(elsewhere)


def paris_put_rows(paris, domain: str, queue: str) -> int:
    import pyarrow.compute as pc

    from storage import deltars, tables

    def count() -> int:
        table = deltars.try_open(tables.PartitionPaths(paris.data_dir, 0).puts)
        if table is None:
            return 0
        rows = table.to_pyarrow_table(columns=["domain", "queue"])
        return pc.sum(pc.and_(pc.equal(rows["domain"], domain), pc.equal(rows["queue"], queue))).as_py() or 0
    last = -1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # until it stops growing
        now = count()
        if now == last and now > 0:
            return now
        last = now
        time.sleep(1.0)
    return last


def test_request_and_response_across_clusters_by_queue_at_cluster(clusters):
    from taproot import Session

    london, paris = clusters
    with Session([london.proxy_address]) as requester, Session([paris.proxy_address]) as responder:
        replies = requester.open_queue("taproot://rpc/replies", read=True)
        requests_out = requester.open_queue("taproot://rpc/requests@paris", write=True)
        requests_in = responder.open_queue("taproot://rpc/requests", read=True)
        replies_out = responder.open_queue("taproot://rpc/replies@london", write=True)
        for i in range(20):
            requests_out.post(b"question %d" % i, properties={"reply_to": "replies@london"}).result(timeout=30)
        answered = 0
        while answered < 20:
            request = requests_in.get(timeout_s=30)
            assert request is not None, f"only {answered} requests reached Paris"
            assert request.properties["reply_to"] == "replies@london"
            replies_out.post(request.payload.replace(b"question", b"answer")).result(timeout=30)
            requests_in.confirm(request)
            answered += 1
        got = drain(replies, 20)
    assert sorted(m.payload for m in got) == sorted(b"answer %d" % i for i in range(20))
    assert {m.properties.get("taproot.via") for m in got} == {"paris"}


def test_unknown_cluster_is_no_route_and_a_remote_queue_is_not_consumed_here(clusters):
    from taproot import RequestError, Session

    london, _ = clusters
    with Session([london.proxy_address]) as session:
        with pytest.raises(RequestError) as no_route:
            session.open_queue("taproot://demo/orders@tokyo", write=True)
        assert no_route.value.code is ResultCode.NO_ROUTE
        with pytest.raises(RequestError) as not_here:
            session.open_queue("taproot://rpc/requests@paris", read=True)
        assert not_here.value.code is ResultCode.INVALID_ARGUMENT
        # queue@<this cluster> is the local queue.
        with session.open_queue("taproot://demo/own@london", write=True) as own, \
                session.open_queue("taproot://demo/own", read=True) as reader:
            guid = own.post(b"home").result(timeout=30).guid
            message = reader.get(timeout_s=30)
            assert message is not None and message.guid == guid
            reader.confirm(message)


def test_a_pull_link_consumes_there_while_consumers_here_subscribe(clusters):
    """Paris pulls `feeds` from London: a consumer in Paris (subscribed to
    EU) makes Paris's primary consume the queue in London with that
    subscription; what London had waiting and what comes later reaches Paris
    once; the US messages stay in London. When the consumer goes, so does
    the pull, and London keeps what is posted after."""
    from taproot import Session

    london, paris = clusters
    uri = "taproot://feeds/prices"
    with Session([london.proxy_address]) as here, Session([paris.proxy_address]) as there:
        producer = here.open_queue(uri, write=True)

        def post(region: str, n: int) -> list[bytes]:
            futures = [producer.post(b"%s %d" % (region.encode(), i), properties={"region": region})
                       for i in range(n)]
            return [f.result(timeout=30).guid for f in futures]
        eu_before, us_before = post("EU", 50), post("US", 30)
        consumer = there.open_queue(uri, read=True, subscription="region = 'EU'")
        eu_after = post("EU", 50)
        got = drain(consumer, 100)
        assert [m.guid for m in got] == eu_before + eu_after      # once each, in PUT order
        assert {m.properties["taproot.via"] for m in got} == {"london"}
        consumer.close()
        time.sleep(2)                                            # the pull goes with the last consumer
        eu_late = post("EU", 20)
        local = here.open_queue(uri, read=True)
        kept = drain(local, 50)
    assert [m.guid for m in kept] == us_before + eu_late


def test_two_clusters_pulling_a_queue_from_each_other_deliver_each_message_once(clusters):
    """London and Paris each pull `feeds/both` from the other while both have
    a consumer on it. A message posted in London may go to London's consumer
    or, pulled, to Paris's; it must never be pulled back (a pull link's
    consumer takes nothing that has been through its own cluster), where it
    would be dropped as a loop and reach nobody."""
    from taproot import Session

    london, paris = clusters
    uri = "taproot://feeds/both"
    with Session([london.proxy_address]) as here, Session([paris.proxy_address]) as there:
        consumers = [here.open_queue(uri, read=True), there.open_queue(uri, read=True)]
        time.sleep(2)                                  # each side's pull opens on the other
        producers = [here.open_queue(uri, write=True), there.open_queue(uri, write=True)]
        guids = [f.result(timeout=30).guid for f in [p.post(b"%d" % i) for i in range(200) for p in producers]]
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < len(guids) and time.monotonic() < deadline:
            for consumer in consumers:
                message = consumer.get(timeout_s=0.1)
                if message is not None:
                    got.append(message.guid)
                    consumer.confirm(message)
        time.sleep(3)
        for consumer in consumers:                     # nothing more may come
            got.extend(m.guid for m in consumer.messages(timeout_s=0.5))
    assert sorted(got) == sorted(guids)                # each once, none lost


def stream_through_faults(london, paris, uri: str, count: int, gap_s: float, faults) -> None:
    """London's producer posts `count` messages to `uri` while Paris's
    consumer reads and confirms them; `faults()` runs meanwhile and returns
    when the last fault (Paris's node restarting) ended. Then every message
    ACKed in London must reach Paris, and a second copy may only be one that
    Paris's restart had in flight: first received before it ended."""
    import threading

    from taproot import Session

    acked: list[bytes] = []
    received: list[tuple[float, bytes]] = []
    problems: list[BaseException] = []
    done, ready = threading.Event(), threading.Event()

    def produce() -> None:
        try:
            with Session([london.proxy_address]) as session, session.open_queue(uri, write=True) as queue:
                futures = []
                for i in range(count):
                    futures.append(queue.post(b"%05d" % i))
                    time.sleep(gap_s)
                acked.extend(f.result(timeout=120).guid for f in futures)
        except BaseException as exc:   # reported below
            problems.append(exc)

    def consume() -> None:
        try:
            with Session([paris.proxy_address], connect_timeout_s=None) as session, \
                    session.open_queue(uri, read=True) as queue:
                ready.set()
                while not done.is_set():
                    message = queue.get(timeout_s=0.2)
                    if message is not None:
                        received.append((time.monotonic(), message.guid))
                        queue.confirm(message)
        except BaseException as exc:
            problems.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert ready.wait(30)
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        paris_back = faults()
        producer.join(300)
        assert not problems, problems
        assert len(acked) == count
        wait_until(lambda: set(acked) <= {g for _, g in received}, 120, what="every ACKed message in Paris")
        time.sleep(3)                              # a late second copy would show now
    finally:
        done.set()
        producer.join(10)
        consumer.join(30)
    assert not problems, problems
    first: dict[bytes, float] = {}
    late = []
    for at, guid in received:
        if guid in first and first[guid] > paris_back:
            late.append(guid)
        first.setdefault(guid, at)
    assert not late, f"{len(late)} second copies of messages first received after Paris's restart"
    assert set(first) == set(acked)


def test_the_link_cut_and_each_side_restarted_mid_stream_loses_and_repeats_nothing(clusters):
    """The push link's host (Paris's proxy) stops and comes back, then
    London's node restarts (its forwarders resume from their progress and
    post their last round again), then Paris's: nothing ACKed in London is
    lost, and no resend of the link is delivered twice."""
    london, paris = clusters

    def faults() -> float:
        time.sleep(2)
        paris.stop_process("proxy1")               # the link is cut
        time.sleep(2)
        paris.start_proxy(name="proxy1")           # and comes back
        time.sleep(2)
        london.restart_node()                      # the sending side restarts
        time.sleep(1)
        paris.restart_node()                       # the receiving side restarts
        return time.monotonic()
    stream_through_faults(london, paris, "taproot://demo/cut", 3000, 0.003, faults)


def test_a_pull_survives_either_side_restarting_mid_stream(clusters):
    """Paris pulls `feeds/ticks` while London's producer posts; London's proxy
    (the pull's host) stops and comes back, London's node restarts (the
    pull's consumer there reconnects, and what it held unconfirmed comes
    again), then Paris's (the pull starts again when the consumer here
    reopens)."""
    london, paris = clusters

    def faults() -> float:
        time.sleep(2)
        london.stop_process("proxy1")              # the pull's host goes (and London's producer's)
        time.sleep(2)
        london.start_proxy(name="proxy1")
        time.sleep(2)
        london.restart_node()
        time.sleep(2)
        paris.restart_node()
        return time.monotonic()
    stream_through_faults(london, paris, "taproot://feeds/ticks", 2000, 0.004, faults)
