"""The pipeline's Spark Connect settings (`pipelines.runner.connect_endpoint`):
which port it takes, that a port in use leaves the endpoint off rather
than stopping the pipeline (Spark would not start with a plugin that cannot
bind), the token it requires with [auth] on, and the addresses it may take."""

from __future__ import annotations

import dataclasses
import logging
import socket

import pytest

import conf
from pipelines.runner import CONNECT_PLUGIN, connect_endpoint

pytestmark = pytest.mark.unit


def _config(port: int, auth: bool = False, state_dir: str = "/tmp/unused") -> conf.ClusterConfig:
    shipped = conf.load(None, data_dir="/tmp/unused", state_dir=state_dir)
    return dataclasses.replace(shipped, pipeline=dataclasses.replace(shipped.pipeline, connect_port=port),
                               auth=dataclasses.replace(shipped.auth, enabled=auth))


def test_the_endpoint_takes_its_port_any_free_one_or_none():
    settings, port = connect_endpoint(_config(0))
    assert port is not None and port > 0
    assert settings == {"spark.plugins": CONNECT_PLUGIN, "spark.connect.grpc.binding.address": "127.0.0.1",
                        "spark.connect.grpc.binding.port": str(port)}
    assert connect_endpoint(_config(-1)) == ({}, None)


def test_with_auth_on_the_endpoint_requires_its_own_token(tmp_path, caplog, monkeypatch):
    from taproot_ops import tokens

    config = _config(0, auth=True, state_dir=str(tmp_path))
    with caplog.at_level(logging.ERROR):     # no token made yet: the endpoint stays off, the pipeline runs
        assert connect_endpoint(config) == ({}, None)
    assert "connect.token" in caplog.text and "taproot auth init" in caplog.text
    assert tokens.init(config)
    token = (tmp_path / "auth" / "connect.token").read_text().strip()
    assert token != (tmp_path / "auth" / "cluster.token").read_text().strip()
    settings, _ = connect_endpoint(config)
    assert settings["spark.connect.authenticate.token"] == token
    # What `taproot sql` presents: the variable pyspark's client reads too, else the file.
    monkeypatch.delenv(conf.CONNECT_TOKEN_ENV, raising=False)
    assert conf.connect_token(config) == token
    monkeypatch.setenv(conf.CONNECT_TOKEN_ENV, "tpk_given")
    assert conf.connect_token(config) == "tpk_given"


def test_pyspark_gets_the_token_in_its_url_on_a_local_connection():
    assert conf.with_connect_token("sc://127.0.0.1:30127", None) == "sc://127.0.0.1:30127"
    assert conf.with_connect_token("sc://127.0.0.1:30127", "tpk_x") == "sc://localhost:30127/;token=tpk_x"
    assert conf.with_connect_token("sc://[::1]:1/;user_id=a", "t") == "sc://localhost:1/;user_id=a;token=t"
    assert conf.with_connect_token("sc://db.example:1/;token=mine", "t") == "sc://db.example:1/;token=mine"


def test_the_endpoint_leaves_loopback_only_with_auth_on():
    raw = {"pipeline": {"connect_host": "0.0.0.0"}, "auth": {"enabled": False}}
    with pytest.raises(conf.ConfigError, match="pipeline.connect_host: '0.0.0.0' is not a loopback address"):
        conf.parse_cluster(raw, {})
    for allowed in ({**raw, "auth": {"enabled": True, "auto": True}},
                    {"pipeline": {"connect_host": "0.0.0.0", "connect_port": -1}},
                    {"pipeline": {"connect_host": "::1"}}, {"pipeline": {"connect_host": "localhost"}}):
        conf.parse_cluster(allowed, {})


def test_a_port_in_use_leaves_the_endpoint_off_and_says_so(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR):
            assert connect_endpoint(_config(busy)) == ({}, None)
    assert f"127.0.0.1:{busy} cannot be bound" in caplog.text and "runs without it" in caplog.text


@pytest.fixture
def unavailable_endpoint(monkeypatch):
    """A gRPC server that answers every call UNAVAILABLE (as a broken HTTP/2
    stream reads to a client), and `storage.spark`'s retries made short, so
    a test takes a second: (its sc:// URL, the calls it got)."""
    from concurrent import futures

    import grpc

    from storage import spark as spark_factory

    calls: list[str] = []

    class Unavailable(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            calls.append(handler_call_details.method)

            def refuse(request, context):
                context.abort(grpc.StatusCode.UNAVAILABLE, "GOAWAY: failed encoding headers block")

            streams = any(m in handler_call_details.method for m in ("Execute", "Reattach"))
            return grpc.unary_stream_rpc_method_handler(refuse) if streams \
                else grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[Unavailable()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setattr(spark_factory, "CONNECT_RETRIES", 3)
    monkeypatch.setattr(spark_factory, "CONNECT_MAX_BACKOFF_MS", 50)
    yield f"sc://127.0.0.1:{port}", calls
    server.stop(0)


@pytest.mark.timeout(60)   # without the bound, PySpark would still be retrying
def test_a_remote_session_gives_up_on_an_endpoint_that_stays_unavailable(unavailable_endpoint):
    """`storage.spark.remote_session` bounds PySpark's retries (its default is
    15 of them, about 7 minutes): an endpoint that answers every call with
    UNAVAILABLE is an error soon, not a hang, and says so."""
    import time

    from storage import spark as spark_factory

    url, calls = unavailable_endpoint
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        with spark_factory.remote_session(url) as remote:
            remote.sql("SELECT 1").collect()
    took = time.monotonic() - started
    assert spark_factory.unavailable(raised.value) == "UNAVAILABLE: GOAWAY: failed encoding headers block"
    assert spark_factory.unavailable(ValueError("[TABLE_OR_VIEW_NOT_FOUND] x")) is None
    assert took < 30, took   # PySpark's own policy would still be retrying (50 ms, x4, up to 60 s, 15 times)
    assert 2 <= len(calls) <= 4 * 4 + 4, calls   # some retries, bounded by ours


@pytest.mark.timeout(60)
def test_replay_on_an_endpoint_that_stays_unavailable_is_an_error_that_says_so(unavailable_endpoint, capsys):
    from taproot_ops import cli

    url, _ = unavailable_endpoint
    code = cli.main(["replay", "--remote", url, "--from", "taproot://demo/a", "--to", "taproot://demo/b",
                     "--hosts", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "RETRIES_EXCEEDED" not in err
    assert f"error: the Spark Connect endpoint at {url} does not answer queries: UNAVAILABLE: GOAWAY" in err, err
