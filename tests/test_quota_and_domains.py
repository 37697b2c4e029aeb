"""Domain configuration (validation, fanout apps, subscriptions) and quotas."""

from __future__ import annotations

import pytest

import conf
from conf import ConfigError, DomainConfig, parse_domain
from primary.quota import DomainQuota
from protocol import ResultCode


@pytest.mark.parametrize("raw, field", [
    ({"mode": "topic"}, "mode"),
    ({"mode": "fanout"}, "app_ids"),                                   # fanout needs apps
    ({"mode": "priority", "app_ids": ["a"]}, "app_ids"),               # only fanout has apps
    ({"mode": "fanout", "app_ids": ["a", "a"]}, "app_ids: duplicate"),
    ({"mode": "fanout", "app_ids": ["bad app"]}, "app_ids"),
    ({"mode": "fanout", "app_ids": ["a"], "subscriptions": {"b": "x = 1"}}, "subscriptions.'b'"),
    ({"mode": "fanout", "app_ids": ["a"], "subscriptions": {"a": "x = "}}, "subscriptions.'a'"),
    ({"subscriptions": {"": "region = 'EU' &&"}}, "subscriptions.''"),
    ({"mode": "broadcast", "message_ttl_ms": 10}, "message_ttl_ms"),
    ({"mode": "broadcast", "subscriptions": {"": "a = 1"}}, "subscriptions"),
    ({"delivery": "fast"}, "delivery: must be one of express, pipeline"),
    ({"mode": "broadcast", "delivery": "pipeline"}, "delivery: broadcast domains store nothing"),
    ({"queue_max_messages": -1}, "queue_max_messages"),
    ({"watermark_percent": 0}, "watermark_percent"),
    ({"max_delivery_attempts": "5"}, "max_delivery_attempts: expected int"),
    ({"max_consumer": 1}, "max_consumer: unknown field"),
])
def test_domain_errors_name_the_field(raw, field):
    with pytest.raises(ConfigError) as info:
        parse_domain("d", raw)
    assert "domains/d.toml" in str(info.value) and field in str(info.value), str(info.value)


def test_fanout_domain_with_subscriptions():
    d = parse_domain("f", {"mode": "fanout", "app_ids": ["billing", "eu"],
                           "subscriptions": {"eu": "region = 'EU'"}, "max_delivery_attempts": 5})
    assert d.apps == ("billing", "eu") and d.subscriptions == {"eu": "region = 'EU'"}
    assert parse_domain("p", {}).apps == ("",)
    assert parse_domain("p", {}).delivery == "express"
    assert parse_domain("q", {"delivery": "pipeline"}).delivery == "pipeline"


def test_corrupt_domain_file_names_the_file(tmp_path):
    (tmp_path / "domains").mkdir()
    (tmp_path / "cluster.toml").write_text("")
    (tmp_path / "domains" / "x.toml").write_text("mode = \n")
    with pytest.raises(ConfigError, match="x.toml: not valid TOML"):
        conf.load(tmp_path / "cluster.toml")


def quota(**limits) -> DomainQuota:
    now = [0.0]
    q = DomainQuota(DomainConfig("d", dedup_history_window_ms=10_000, **limits), clock=lambda: now[0])
    q.now = now  # type: ignore[attr-defined]
    return q


def test_queue_message_limit_refuses_then_accepts_after_confirms():
    q = quota(queue_max_messages=2)
    assert q.admit("a", b"1", 10) is None and q.admit("a", b"2", 10) is None
    code, text = q.admit("a", b"3", 10)
    assert code == ResultCode.LIMIT_MESSAGES and "queue_max_messages" in text
    assert q.admit("b", b"4", 10) is None            # another queue has its own limit
    q.delivered("a", b"1", 10, {""})
    q.app_done(b"1", "")
    assert q.usage("a") == (1, 10)
    assert q.admit("a", b"3", 10) is None


def test_domain_byte_limit_and_fanout_done_only_when_every_app_confirmed():
    q = quota(domain_max_bytes=100)
    assert q.admit("a", b"1", 60) is None
    code, _ = q.admit("b", b"2", 50)
    assert code == ResultCode.LIMIT_BYTES
    q.delivered("a", b"1", 60, {"x", "y"})
    q.app_done(b"1", "x")
    assert q.usage() == (1, 60)
    q.app_done(b"1", "y")
    assert q.usage() == (0, 0)


def test_retransmissions_count_once_even_after_the_original_finished():
    q = quota(queue_max_messages=5)
    q.admit("a", b"1", 1)
    q.admit("a", b"1", 1)
    assert q.usage("a") == (1, 1)
    q.delivered("a", b"1", 1, set())                 # auto-confirmed by every app
    assert q.usage("a") == (0, 0)
    q.admit("a", b"1", 1)                            # within the history window: the pipeline drops it
    assert q.usage("a") == (0, 0)
    q.now[0] = 11.0                                  # type: ignore[attr-defined]
    q.admit("a", b"9", 1)
    q.delivered("a", b"9", 1, set())                 # prunes the old entry
    q.admit("a", b"1", 1)
    assert q.usage("a") == (1, 1)


def test_failed_commit_gives_the_room_back():
    q = quota(queue_max_messages=1)
    q.admit("a", b"1", 1)
    q.unadmit(b"1")
    assert q.admit("a", b"2", 1) is None


@pytest.mark.parametrize("content, words", [
    (b"nodes = 5\n", "nodes: must be an array of tables ([[nodes]] sections), got int 5"),
    (b'[cluster]\nha = "x"\n', "cluster.ha: unknown field"),
    (b'[cluster]\nnodes = "n1"\n', "cluster.nodes: unknown field"),
    (b'[cluster]\ndomains = "x"\n', "cluster.domains: unknown field"),
    (b"\xff\xfe not text\n", "not UTF-8 text"),
    (("a = " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested too deeply"),
])
def test_a_cluster_file_that_cannot_be_a_configuration_is_a_config_error_not_a_traceback(tmp_path, content, words):
    """Issue 16, defect 3: each of these raised TypeError, UnicodeDecodeError or
    RecursionError (a traceback from check-config and every role), or was
    silently accepted."""
    path = tmp_path / "cluster.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        conf.load(path)
    assert words in str(info.value) and str(path) in str(info.value)


def test_a_directory_where_a_config_file_should_be_is_a_config_error(tmp_path):
    (tmp_path / "cluster.toml").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        conf.load(tmp_path / "cluster.toml")
    (tmp_path / "other.toml").write_text("")
    (tmp_path / "domains" / "x.toml").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"x.toml: is a directory"):
        conf.load(tmp_path / "other.toml")


def test_the_pipelines_domain_reloader_keeps_the_last_good_domains_whatever_the_file(tmp_path):
    """Issue 16, defect 2: a domain file that is not UTF-8, or a directory
    named x.toml, failed the pipeline's batch and ended the process."""
    from pipelines.fanout import DomainsReloader

    domains = tmp_path / "domains"
    domains.mkdir()
    (domains / "good.toml").write_text('mode = "priority"\n')
    reloader = DomainsReloader(domains, conf.load_domains(domains))
    (domains / "bad.toml").write_bytes(b"\xff\xfe")
    assert set(reloader()) == {"good"}
    (domains / "bad.toml").unlink()
    (domains / "dir.toml").mkdir()
    assert set(reloader()) == {"good"}
    (domains / "dir.toml").rmdir()
    (domains / "later.toml").write_text('mode = "fanout"\napp_ids = ["a"]\n')
    assert set(reloader()) == {"good", "later"}   # reloads carry on after the bad files


def test_a_domain_file_that_is_a_link_loop_or_a_dangling_link_is_a_config_error(tmp_path):
    """Found by the reload fuzz: a symlink loop named x.toml raised OSError
    out of the loader (a traceback at start, a logged one on reload)."""
    (tmp_path / "cluster.toml").write_text("")
    domains = tmp_path / "domains"
    domains.mkdir()
    (domains / "loop.toml").symlink_to("loop.toml")
    with pytest.raises(ConfigError, match=r"loop.toml: cannot be read"):
        conf.load(tmp_path / "cluster.toml")
    (domains / "loop.toml").unlink()
    (domains / "gone.toml").symlink_to("nowhere.toml")
    with pytest.raises(ConfigError, match=r"gone.toml: file not found"):
        conf.load(tmp_path / "cluster.toml")
