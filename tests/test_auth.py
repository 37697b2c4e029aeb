"""Token auth: the tokens file and its checks, the edge's verdicts, and a
two-node tree with `[auth]` on (no TLS: the shipped configuration's TLS and
auth together are what `tests/test_node_integration.py` runs on). Refusals
come with their code and name the missing right; a revoked token's session
is cut off and each of its PUTs still gets exactly one ACK; no role's log
holds a token."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import stat
import time
from pathlib import Path

import grpc
import pytest

import conf
from protocol import ResultCode, pb, pb_grpc
from protocol import auth as auth_mod
from protocol.auth import (
    Authenticator,
    AuthError,
    Denied,
    LinkAuth,
    TokenEntry,
    TokenStore,
    admin_scope,
    admit,
    dump_tokens,
    parse_tokens,
    presented,
    token_hash,
)
from taproot_ops import tokens
from tests.conftest import cluster_from
from tests.test_node_parking import uri_on

DIGEST = "ab" * 32


# -- the tokens file -------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_tokens_file_with_a_mistake_is_refused_naming_the_field():
    good = {"name": "app", "sha256": DIGEST, "produce": ["orders"]}
    for item, says in (
            ({**good, "sha256": "ABC"}, "tokens[0].sha256: must be the token's SHA-256"),
            ({**good, "produce": "orders"}, "tokens[0].produce: must be a list of domain names"),
            ({**good, "write": ["orders"]}, "tokens[0]: unknown field 'write'"),
            ({**good, "expires": "tomorrow"}, "tokens[0].expires: must be a TOML date-time"),
            ({"sha256": DIGEST}, "tokens[0].name: must be a non-empty string")):
        with pytest.raises(AuthError) as err:
            parse_tokens({"tokens": [item]}, "t.toml")
        assert str(err.value).startswith(f"t.toml: {says}"), err.value
    with pytest.raises(AuthError, match="'app' is used twice"):
        parse_tokens({"tokens": [good, {**good, "sha256": "cd" * 32}]}, "t.toml")
    with pytest.raises(AuthError, match="unknown section 'users'"):
        parse_tokens({"users": []}, "t.toml")


@pytest.mark.unit
def test_the_file_written_reads_back_the_same_and_holds_no_token(tmp_path):
    path = tmp_path / "auth" / "tokens.toml"
    token = tokens.add(path, "orders-app", produce=["orders"], consume=["orders", "audit"], admin=["orders"],
                       expires=1_900_000_000)
    assert token.startswith("tpk_") and len(token) > 40
    text = path.read_text()
    assert token not in text and token_hash(token).removeprefix("sha256:") in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [entry] = auth_mod.load_tokens(path).values()
    assert entry == TokenEntry("orders-app", token_hash(token), frozenset({"orders"}), frozenset({"orders", "audit"}),
                               frozenset({"orders"}), 1_900_000_000.0)
    assert auth_mod.load_tokens(path) == parse_tokens(__import__("tomllib").loads(dump_tokens([entry])), "again")
    with pytest.raises(AuthError, match="already in"):
        tokens.add(path, "orders-app", produce=["orders"])
    with pytest.raises(AuthError, match="not a domain name"):
        tokens.add(path, "other", consume=["no spaces"])
    assert tokens.revoke(path, "orders-app") and not tokens.revoke(path, "orders-app")
    assert auth_mod.load_tokens(path) == {}


@pytest.mark.unit
def test_expiry_is_a_span_or_a_date():
    assert tokens.parse_expires("30d", 1000.0) == 1000.0 + 30 * 86400
    assert tokens.parse_expires("90m", 0.0) == 5400.0
    midnight = dt.datetime(2027, 1, 31, tzinfo=dt.timezone.utc).timestamp()
    assert tokens.parse_expires("2027-01-31T00:00:00Z", 0.0) == midnight
    assert tokens.parse_expires("2027-01-31T00:00:00", 0.0) == midnight          # UTC unless it says
    assert tokens.parse_expires("2027-01-31T01:00:00+01:00", 0.0) == midnight
    with pytest.raises(AuthError, match="give a span"):
        tokens.parse_expires("soon", 0.0)


@pytest.mark.unit
def test_auth_settings_are_checked(tmp_path):
    with pytest.raises(conf.ConfigError, match="auth.tokens_file: auth is enabled without auto: set "
                                               "auth.tokens_file, auth.cluster_token_file"):
        conf.parse_cluster({"auth": {"enabled": True}}, {})
    with pytest.raises(conf.ConfigError, match="auth.token: unknown field"):
        conf.parse_cluster({"auth": {"token": "x"}}, {})
    config = conf.parse_cluster({"auth": {"enabled": True, "auto": True}}, {})
    assert config.auth.files("/d") == ("/d/auth/tokens.toml", "/d/auth/cluster.token")
    config = dataclasses.replace(config, data_dir=str(tmp_path))
    with pytest.raises(conf.ConfigError, match=f"auth: token file {tmp_path}/auth/cluster.token: cannot be read: "
                                               "No such file or directory \\(the embedded cluster makes them"):
        conf.authenticator(config)
    assert tokens.init(config) and not tokens.init(config)        # made once, then kept
    assert [e.name for e in conf.authenticator(config).store.entries] == ["local"]


@pytest.mark.unit
def test_check_config_reports_auth_and_names_an_unreadable_link_token(tmp_path, capsys):
    from taproot_ops.cli import main

    shutil.copytree(conf.PACKAGE_DIR / "domains", tmp_path / "domains")
    cluster_file = tmp_path / "cluster.toml"
    data = tmp_path / "data"
    base = f'[cluster]\ndata_dir = "{data}"\n[auth]\nenabled = true\nauto = true\n'
    cluster_file.write_text(base)
    assert main(["check-config", "--config", str(cluster_file)]) == 0
    assert f"auth: on; the cluster token and a local token are made in {data}/auth" in capsys.readouterr().out
    tokens.init(dataclasses.replace(conf.load(cluster_file), data_dir=str(data)))
    assert main(["check-config", "--config", str(cluster_file)]) == 0
    assert f"auth: on; 1 tokens in {data}/auth/tokens.toml" in capsys.readouterr().out
    link = ('[[links]]\nname = "to-paris"\ncluster = "paris"\nhosts = ["127.0.0.1:1"]\ndomains = ["demo"]\n'
            f'token_file = "{tmp_path}/paris.token"\n')
    cluster_file.write_text(base + link)
    assert main(["check-config", "--config", str(cluster_file)]) == 2
    assert f"links 'to-paris': token file {tmp_path}/paris.token: cannot be read" in capsys.readouterr().err
    (tmp_path / "paris.token").write_text("tpk_issued_by_paris\n")
    assert main(["check-config", "--config", str(cluster_file)]) == 0
    assert f"link to-paris -> paris (push, demo): token from {tmp_path}/paris.token" in capsys.readouterr().out
    assert conf.link_tokens(dataclasses.replace(conf.load(cluster_file), data_dir=str(data)))["to-paris"] == \
        "tpk_issued_by_paris"


@pytest.mark.unit
def test_a_token_grpc_cannot_carry_is_refused_when_the_session_is_made():
    from taproot import Session

    for bad in ("two words", "tpk_é", "tpk_\x07"):
        with pytest.raises(AuthError, match="printable ASCII without spaces"):
            Session(["127.0.0.1:1"], token=bad)
    assert auth_mod.metadata("tpk_ok") == (("authorization", "Bearer tpk_ok"),) and auth_mod.metadata(None) == ()


# -- the verdicts ----------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def authenticator(tmp_path: Path, **rights) -> tuple[Authenticator, str, Clock, Path]:
    """An authenticator over a tokens file holding one token `app` (and the
    cluster token "cluster-secret"), on a clock the test moves."""
    path = tmp_path / "tokens.toml"
    token = tokens.add(path, "app", **rights)
    clock = Clock()
    return Authenticator(TokenStore(str(path), token_hash("cluster-secret")), clock), token, clock, path


def open_frame(uri: str, read: bool = False, write: bool = False) -> pb.Frame:
    return pb.Frame(open_queue=pb.OpenQueue(request_id=7, queue_id=3, uri=uri, read=read, write=write))


@pytest.mark.unit
def test_each_refusal_has_its_code_and_names_what_is_missing(tmp_path):
    auth, token, clock, _ = authenticator(tmp_path, produce=["orders"], admin=["orders"])
    me = token_hash(token)
    assert isinstance(auth.check(me, ("produce",), "orders"), TokenEntry)
    assert auth.check(me, ("consume",), "orders") == Denied(
        ResultCode.NOT_AUTHORIZED, "token 'app' lacks the consume right on domain 'orders'")
    assert auth.check(me, ("produce",), "billing") == Denied(
        ResultCode.NOT_AUTHORIZED, "token 'app' lacks the produce right on domain 'billing'")
    assert auth.check(me, ("admin",), "*") == Denied(
        ResultCode.NOT_AUTHORIZED, "token 'app' lacks the admin right cluster-wide (admin on \"*\")")
    assert auth.check(None, (), "orders").code == ResultCode.UNAUTHENTICATED
    assert "none was presented" in auth.check(None, (), "orders").message
    assert auth.check(token_hash("tpk_guess"), (), "orders") == Denied(
        ResultCode.UNAUTHENTICATED, "token not known here (wrong, or revoked)")
    assert auth.check("malformed", (), "orders").message == "the authorization metadata must be 'Bearer <token>'"
    every = auth.check(token_hash("cluster-secret"), ("produce", "consume", "admin"), "*")
    assert isinstance(every, TokenEntry) and every.cluster


@pytest.mark.unit
def test_an_expired_token_is_refused_from_the_second_it_expires(tmp_path):
    path = tmp_path / "tokens.toml"
    token = tokens.add(path, "brief", consume=["*"], expires=1_060.0)
    clock = Clock()
    auth = Authenticator(TokenStore(str(path)), clock)
    assert isinstance(auth.check(token_hash(token), ("consume",), "any"), TokenEntry)
    clock.now = 1_060.0
    assert auth.check(token_hash(token), ("consume",), "any") == Denied(
        ResultCode.UNAUTHENTICATED, "token 'brief' expired at 1970-01-01T00:17:40Z")


@pytest.mark.unit
def test_the_edge_refuses_a_read_open_without_consume_and_lets_a_write_open_through(tmp_path):
    auth, token, clock, path = authenticator(tmp_path, produce=["orders"])
    link = LinkAuth(token_hash(token))
    refusal = admit(auth, link, open_frame("taproot://orders/q", read=True))
    assert isinstance(refusal, pb.Frame)
    response = refusal.open_queue_response
    assert (response.request_id, response.queue_id) == (7, 3)
    assert response.status.code == ResultCode.NOT_AUTHORIZED
    assert response.status.message == "token 'app' lacks the consume right on domain 'orders'"
    assert admit(auth, link, open_frame("taproot://orders/q", write=True)) is None
    assert admit(auth, link, open_frame("taproot://orders/q@paris", write=True)) is None   # the domain is checked
    assert admit(auth, link, open_frame("not a uri", write=True)) is None    # the role answers INVALID_ARGUMENT
    # Once a queue is open the token is looked up again each second: revoked, the link must go.
    put = pb.Frame(put=pb.PutBatch())
    assert admit(auth, link, put) is None
    tokens.revoke(path, "app")
    assert admit(auth, link, put) is None            # within the second: not looked up again yet
    clock.now += auth_mod.RECHECK_S
    auth.store._checked -= auth_mod.RECHECK_S        # the file's own once-a-second check is due too
    assert admit(auth, link, put) == "token not known here (wrong, or revoked)"


@pytest.mark.unit
def test_a_token_just_added_is_known_at_once_and_a_broken_file_keeps_the_last_good_one(tmp_path, caplog):
    auth, token, clock, path = authenticator(tmp_path, consume=["a"])
    later = tokens.add(path, "later", consume=["a"])
    assert isinstance(auth.check(token_hash(later), ("consume",), "a"), TokenEntry)
    path.write_text("[[tokens]\nbroken")
    auth.store._checked -= auth_mod.RECHECK_S
    assert isinstance(auth.check(token_hash(token), ("consume",), "a"), TokenEntry)
    assert "not valid TOML" in caplog.text and "keeping the 2 tokens read before" in caplog.text


@pytest.mark.unit
def test_presented_keeps_only_the_hash():
    assert presented([("authorization", "Bearer tpk_x")]) == token_hash("tpk_x")
    assert presented([("x-other", "1"), ("authorization", b"bearer tpk_y")]) == token_hash("tpk_y")
    assert presented([("authorization", "Basic dXNlcg==")]) == "malformed"
    assert presented([]) is None and presented(None) is None


@pytest.mark.unit
def test_admin_commands_need_admin_on_their_domain_or_cluster_wide():
    assert admin_scope(pb.AdminRequest(command="status")) == "*"
    assert admin_scope(pb.AdminRequest(command="domains")) == "*"
    assert admin_scope(pb.AdminRequest(command="stop")) == "*"
    assert admin_scope(pb.AdminRequest(command="queues")) == "*"
    assert admin_scope(pb.AdminRequest(command="queues", domain="orders")) == "orders"
    assert admin_scope(pb.AdminRequest(command="purge", uri="taproot://orders/q?id=audit")) == "orders"
    assert admin_scope(pb.AdminRequest(command="queue", uri="bad")) == "*"


# -- a two-node tree with [auth] on ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    with cluster_from("ha_conf", tmp_path_factory, extra="\n[auth]\nenabled = true\nauto = true\n",
                      with_pipeline=False) as cluster:
        cluster.issued = []                          # type: ignore[attr-defined]  every token made here
        yield cluster


def issue(tree, name: str, **rights) -> str:
    token = tokens.add(Path(tree.config.auth.files(tree.data_dir)[0]), name, **rights)
    tree.issued.append(token)
    return token


def refusals(tree, name: str, code: str = "NOT_AUTHORIZED") -> float:
    """`taproot_auth_refusals_total{code}` of a role, scraped."""
    from tests.test_metrics import scrape, value
    return value(scrape(tree.metrics_url(name)), "taproot_auth_refusals_total", code=code)


def entry_points(tree) -> list[str]:
    """A proxy (in front of node1) and node2 itself: each is the edge that checks."""
    return [tree.proxy_addresses["proxy1"], tree.node_addresses["node2"]]


@pytest.mark.integration
def test_opens_without_a_good_token_are_refused_with_their_code(tree):
    from taproot import Session, UnauthenticatedError

    expired = issue(tree, "expired", produce=["demo"], expires=time.time() - 1)
    for address in entry_points(tree):
        for token, says in ((None, "none was presented"), ("tpk_wrong", "token not known here"),
                            (expired, "token 'expired' expired at")):
            os.environ.pop("TAPROOT_TOKEN", None)
            with Session([address], token=token or "") as session:
                with pytest.raises(UnauthenticatedError) as err:
                    session.open_queue(uri_on(0, domain="demo"), write=True, timeout_s=10)
                assert err.value.code == ResultCode.UNAUTHENTICATED and says in err.value.message, address


@pytest.mark.integration
def test_a_token_without_consume_may_write_but_not_read(tree):
    from taproot import NotAuthorizedError, Session
    from tests.conftest import collect

    writer_token = issue(tree, "writer", produce=["demo"])
    reader_token = issue(tree, "reader", consume=["demo"])
    edges = {tree.proxy_addresses["proxy1"]: "proxy1", tree.node_addresses["node2"]: "node2"}
    before = {name: refusals(tree, name) for name in ("proxy1", "node1", "node2")}
    for address in entry_points(tree):
        for partition in (0, 1):                      # one queue on each node: the proxy and node1 relay
            uri = uri_on(partition, domain="demo")
            with Session([address], token=writer_token) as writer_session, \
                    Session([address], token=reader_token) as reader_session:
                with pytest.raises(NotAuthorizedError) as err:
                    writer_session.open_queue(uri, read=True, timeout_s=10)
                assert err.value.code == ResultCode.NOT_AUTHORIZED
                assert err.value.message == "token 'writer' lacks the consume right on domain 'demo'"
                with pytest.raises(NotAuthorizedError, match="token 'reader' lacks the produce right on domain"):
                    reader_session.open_queue(uri, write=True, timeout_s=10)
                reader = reader_session.open_queue(uri, read=True)
                writer = writer_session.open_queue(uri, write=True)
                acks = [writer.post(f"{address}-{i}".encode()) for i in range(5)]
                assert all(a.result(timeout=30).guid for a in acks)
                got = collect(reader, 5, timeout_s=30)
                assert sorted(m.payload for m in got) == sorted(f"{address}-{i}".encode() for i in range(5))
                reader.close()
    # Each edge counted its own four refusals (two queues, two tokens each missing a right); node1,
    # relaying for proxy1 with the cluster token, refused nothing.
    for name in edges.values():
        assert refusals(tree, name) == before[name] + 4, name
    assert refusals(tree, "node1") == before["node1"]


@pytest.mark.integration
def test_admin_commands_are_refused_without_admin(tree, capsys, monkeypatch):
    from taproot_ops.cli import main

    scoped = issue(tree, "demo-admin", admin=["demo"])
    nothing = issue(tree, "producer", produce=["demo"])
    node = tree.node_addresses["node1"]

    def run(token: str, *args: str) -> tuple[int, str]:
        monkeypatch.setenv("TAPROOT_TOKEN", token)
        code = main(["admin", "--config", str(tree.config_path), "--data-dir", tree.data_dir,
                     f"--host={node}", *args])
        out = capsys.readouterr()
        return code, out.out + out.err

    code, out = run(nothing, "queues", "--domain", "demo")
    assert code == 1 and "NOT_AUTHORIZED" in out and "token 'producer' lacks the admin right on domain 'demo'" in out
    code, out = run(scoped, "status")
    assert code == 1 and "lacks the admin right cluster-wide" in out
    code, out = run(scoped, "--json", "queues", "--domain", "demo")
    assert code == 0, out
    code, out = run(scoped, "queue", "taproot://demo/nothing-here")   # allowed: the node answers about the queue
    assert code == 1 and ("no such queue" in out or "is led by node node2" in out), out
    monkeypatch.delenv("TAPROOT_TOKEN")
    # Without TAPROOT_TOKEN the tool takes this machine's local token ([auth] auto): every right.
    code = main(["admin", "--config", str(tree.config_path), "--data-dir", tree.data_dir, f"--host={node}", "status"])
    assert code == 0, capsys.readouterr()
    capsys.readouterr()


@pytest.mark.integration
def test_only_the_cluster_token_may_send_delivery_notices(tree):
    node = tree.node_addresses["node1"]
    admin_token = tree.client_token                      # every right, but not the cluster's own token
    before = refusals(tree, "node1")
    with grpc.insecure_channel(node) as channel:
        stub = pb_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.NotifyDelivery(pb.DeliveryNotice(partition=0), timeout=10,
                                metadata=auth_mod.metadata(admin_token))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refusals(tree, "node1") == before + 1              # counted as NOT_AUTHORIZED
        stub.NotifyDelivery(pb.DeliveryNotice(partition=0), timeout=10,
                            metadata=auth_mod.metadata(tree.cluster_token))


@pytest.mark.integration
def test_a_revoked_token_is_cut_off_and_each_put_still_gets_one_ack(tree, caplog):
    """Revoked while its session posts: within about a second the edge drops
    the stream, the SDK's reopen is refused and the queue closes; every PUT
    posted was answered once (ACKed before the cut, or refused with
    UNAUTHENTICATED), and the next post and open say why."""
    from taproot import AckError, PostError, Session, UnauthenticatedError

    uri = uri_on(1, domain="demo")
    tokens_file = Path(tree.config.auth.files(tree.data_dir)[0])
    for address in entry_points(tree):
        name = f"leaver-{address.rsplit(':', 1)[1]}"
        token = issue(tree, name, produce=["demo"])
        with Session([address], token=token) as session:
            queue = session.open_queue(uri, write=True)
            assert queue.post(b"before").result(timeout=30).guid
            assert tokens.revoke(tokens_file, name)
            revoked = time.monotonic()
            futures, closed = [], None
            while closed is None and time.monotonic() < revoked + 30:
                try:
                    futures.append(queue.post(b"after"))
                except PostError as exc:
                    closed = exc
                time.sleep(0.02)
            assert closed is not None and "is closed" in str(closed), f"{address}: still posting after 30 s"
            assert time.monotonic() - revoked < 10
            codes = []
            for future in futures:
                try:
                    future.result(timeout=30)
                    codes.append(ResultCode.SUCCESS)
                except AckError as exc:
                    codes.append(exc.code)
            assert set(codes) <= {ResultCode.SUCCESS, ResultCode.UNAUTHENTICATED}, (address, codes)
            with pytest.raises(UnauthenticatedError, match="token not known here"):
                session.open_queue(uri, write=True, timeout_s=10)
    assert "reopen refused: token not known here" in caplog.text
    assert all(t not in caplog.text for t in tree.issued)
    # The edges logged each cut, naming why (and, `test_no_log_line_holds_a_token`, never the token).
    assert role_logs(tree).count("dropped: token: token not known here (wrong, or revoked)") >= 2


@pytest.mark.integration
def test_no_log_line_holds_a_token(tree):
    """Last in the module: every role's log of the whole run, and the cluster's own tokens."""
    secrets = list(tree.issued) + [tree.cluster_token, tree.client_token]
    text = role_logs(tree)
    assert text.count("serving on") >= 4               # two nodes, two proxies
    for secret in secrets:
        assert secret and secret not in text


def role_logs(cluster) -> str:
    """Every role's log so far."""
    return "".join(log.read_text(errors="replace") for log in sorted((Path(cluster.data_dir) / "logs").glob("*.log")))
