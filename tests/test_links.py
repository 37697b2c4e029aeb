"""Federation links without a cluster: the `[[links]]` configuration, the
routes of `queue@cluster` at open, which PUT-log rows a link forwards (and
with which `taproot.via`), and its progress file. The two-cluster test is
test_federation.py."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conf
from conf import ConfigError, parse_domain
from primary.admission import Open, Refusal, Routes, check_open
from primary.links import VIA, LinkForwarder, Progress, with_entry
from protocol import ResultCode, pb
from storage import tables

DOMAINS = {"demo": parse_domain("demo", {}),
           "events": parse_domain("events", {"subscriptions": {"": "region = 'EU'"}}),
           "bcast": parse_domain("bcast", {"mode": "broadcast"}),
           "other": parse_domain("other", {})}


def cluster(*links: dict, name: str = "london") -> conf.ClusterConfig:
    return conf.parse_cluster({"cluster": {"name": name}, "links": list(links)}, DOMAINS)


def link(**fields) -> dict:
    return {"name": "to-paris", "cluster": "paris", "hosts": ["127.0.0.1:30115"], "domains": ["demo"], **fields}


def test_links_parse_with_their_defaults():
    (parsed,) = cluster(link()).links
    assert (parsed.cluster, parsed.hosts, parsed.domains, parsed.direction, parsed.forward) == (
        "paris", ("127.0.0.1:30115",), ("demo",), "push", "all")


@pytest.mark.parametrize("fields, message", [
    ({"domains": ["nope"]}, "no domain 'nope'"),
    ({"domains": ["bcast"]}, "broadcast domain"),
    ({"domains": []}, "non-empty list"),
    ({"domains": "demo"}, "non-empty list"),
    ({"hosts": ["nohost"]}, "not a host:port"),
    ({"hosts": []}, "non-empty list"),
    ({"cluster": "london"}, "this cluster's own name"),
    ({"cluster": "bad name"}, r"links\[0\]\.cluster: must match"),
    ({"forward": "some"}, "forward: must be one of all, unmatched, none"),
    ({"direction": "both"}, "direction: must be one of push, pull"),
    ({"direction": "pull", "forward": "all"}, "forward is for push links"),
    ({"colour": "red"}, r"links\[0\]\.colour: unknown field"),
    ({"batch_messages": 0}, "batch_messages: must be between"),
])
def test_bad_links_are_config_errors_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        cluster(link(**fields))


def test_two_links_may_not_route_one_domain_to_one_cluster_nor_share_a_name():
    with pytest.raises(ConfigError, match="both push domain 'demo' to cluster 'paris'"):
        cluster(link(), link(name="again"))
    with pytest.raises(ConfigError, match="another link is named"):
        cluster(link(), link(domains=["events"]))
    assert len(cluster(link(), link(name="events", domains=["events"])).links) == 2


def test_the_cluster_name_must_fit_queue_at_cluster():
    with pytest.raises(ConfigError, match="cluster.name"):
        cluster(name="has space")


ROUTES = Routes("london", frozenset({("demo", "paris")}))


def opened(uri: str, read: bool = False):
    return check_open(pb.OpenQueue(uri=uri, read=read, write=not read), DOMAINS, ROUTES)


def test_queue_at_cluster_opens_for_writing_only_where_a_link_routes_it():
    routed = opened("taproot://demo/replies@paris")
    assert isinstance(routed, Open) and routed.uri.queue == "replies@paris" and routed.uri.cluster == "paris"
    for uri, read, code in [("taproot://demo/replies@tokyo", False, ResultCode.NO_ROUTE),
                            ("taproot://other/replies@paris", False, ResultCode.NO_ROUTE),
                            ("taproot://demo/replies@paris", True, ResultCode.INVALID_ARGUMENT),
                            ("taproot://demo/replies@", False, ResultCode.INVALID_ARGUMENT)]:
        refused = opened(uri, read)
        assert isinstance(refused, Refusal) and refused.code is code, (uri, refused)
    own = opened("taproot://demo/replies@london", read=True)
    assert isinstance(own, Open) and own.uri.queue == "replies" and own.uri.cluster == ""


def put_rows(rows: list[tuple[str, str, dict]]) -> pa.Table:
    """PUT-log rows: (domain, queue, string properties)."""
    n = len(rows)
    return pa.table({
        "domain": [d for d, _, _ in rows], "queue": [q for _, q, _ in rows],
        "guid": [bytes([i]) * 16 for i in range(n)], "seq": pa.array(range(n), pa.int64()),
        "payload": [b"p%d" % i for i in range(n)],
        "properties": pa.array([list(p.items()) for _, _, p in rows], tables.PROPERTY_MAP),
        "property_types": pa.array([[(k, "string") for k in p] for _, _, p in rows], tables.PROPERTY_MAP),
        "compression": pa.nulls(n, pa.string())})


ROWS = put_rows([
    ("demo", "orders", {}),                       # 0: local
    ("demo", "replies@paris", {}),                # 1: routed there
    ("demo", "replies@tokyo", {}),                # 2: routed elsewhere
    ("demo", "orders", {VIA: "paris"}),           # 3: came from there: a loop
    ("demo", "orders", {VIA: "berlin"}),          # 4: passed berlin only
    ("events", "clicks", {"region": "EU"}),       # 5: a local app takes it
    ("events", "clicks", {"region": "US"}),       # 6: no local app does
    ("other", "orders", {}),                      # 7: a domain the link does not carry
])


def forwarded(forward: str, domains=("demo", "events")) -> pa.Table:
    (config,) = cluster(link(forward=forward, domains=list(domains))).links
    forwarder = LinkForwarder(config, "london", 0, "/nonexistent", lambda: DOMAINS)
    return forwarder.select(ROWS)


def test_a_link_forwards_by_its_mode_routes_by_cluster_and_never_back_where_a_message_was():
    chosen = forwarded("all")
    assert chosen["seq"].to_pylist() == [0, 1, 4, 5, 6]
    assert chosen["remote_queue"].to_pylist() == ["orders", "replies", "orders", "clicks", "clicks"]
    vias = [dict(p)[VIA] for p in chosen["properties"].to_pylist()]
    assert vias == ["london", "london", "berlin,london", "london", "london"]
    assert all(dict(t)[VIA] == "string" for t in chosen["property_types"].to_pylist())
    assert chosen["guid"].to_pylist() == [ROWS["guid"][i].as_py() for i in (0, 1, 4, 5, 6)]
    assert dict(chosen["properties"][3].as_py())["region"] == "EU"       # its own properties go along
    assert forwarded("unmatched")["seq"].to_pylist() == [1, 6]           # demo's one app takes all; EU stays
    assert forwarded("none")["seq"].to_pylist() == [1]                   # queue@paris only
    assert forwarded("all", ["other"])["seq"].to_pylist() == [7]       # only the domains it carries
    assert forwarded("none", ["events"]).num_rows == 0                  # nothing: an empty table, no error


def test_progress_survives_a_restart_and_a_torn_file_starts_over(tmp_path, caplog):
    """A torn file sends the link back to the log's start (the other side's
    dedup window drops what it has): never past what it has not sent."""
    progress = Progress(str(tmp_path / "links" / "to-paris.json"))
    assert progress.load() is None            # a link that never ran
    progress.save(12, 3400)
    assert Progress(progress.path).load() == (12, 3400)
    assert json.loads((tmp_path / "links" / "to-paris.json").read_text())["seq"] == 3400
    (tmp_path / "links" / "to-paris.json").write_text('{"version": 1')
    with caplog.at_level(logging.ERROR):
        assert progress.load() == (-1, -1)
    assert "unreadable" in caplog.text


@settings(deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", VIA, "c"]), st.text(max_size=3)), max_size=4),
                max_size=8),
       st.integers(0, 3))
def test_with_entry_sets_one_key_per_row_as_a_python_dict_update_would(maps, sliced):
    """The vectorised map rewrite against the obvious per-row one, on random
    maps (the key present, absent, present twice), sliced or not."""
    array = pa.array(maps, tables.PROPERTY_MAP)
    array = array.slice(min(sliced, len(maps)))
    rows = array.to_pylist()
    values = pa.array([f"v{i}" for i in range(len(rows))], pa.string())
    got = with_entry(array, VIA, values).to_pylist()
    assert got == [[(k, v) for k, v in row if k != VIA] + [(VIA, f"v{i}")] for i, row in enumerate(rows)]


def test_a_link_that_never_ran_starts_where_the_log_is_and_one_that_ran_where_it_stopped(tmp_path):
    (config,) = cluster(link()).links
    fresh = LinkForwarder(config, "london", 0, str(tmp_path), lambda: DOMAINS, start_at=(41, 9_999))
    assert (fresh.version, fresh.seq, fresh.needed_version) == (41, 9_999, 42)   # no history forwarded
    fresh.progress.save(57, 12_345)
    again = LinkForwarder(config, "london", 0, str(tmp_path), lambda: DOMAINS, start_at=(80, 20_000))
    assert (again.version, again.seq) == (57, 12_345)                          # nothing skipped


def test_a_pull_links_consumer_takes_nothing_that_has_been_through_its_cluster():
    from primary.admission import for_link
    from primary.dispatcher import ConsumerOptions
    from protocol.expression import compile_expression

    plain = ConsumerOptions(10, 1 << 20, 0)
    assert for_link(plain, "") is plain                                  # a consumer of this cluster
    everything = for_link(plain, "paris").subscriptions
    eu = for_link(ConsumerOptions(subscriptions=(compile_expression("region = 'EU'"),)), "paris").subscriptions
    for props, want_all, want_eu in [({}, True, False), ({"region": "EU"}, True, True),
                                     ({"region": "EU", VIA: "paris"}, False, False),
                                     ({"region": "EU", VIA: "berlin,paris"}, False, False),
                                     ({"region": "EU", VIA: "parisian"}, True, True)]:
        assert any(s.matches(props) for s in everything) is want_all, props
        assert any(s.matches(props) for s in eu) is want_eu, props
    assert [s.text for s in eu] == ["region = 'EU'"]
