"""TLS on every link: the configuration's checks, and a two-node tree with
mutual TLS (a throwaway CA): the SDK through a proxy to a queue of each
node's partition (proxy -> node, node -> node), the admin API, the
pipeline's notice; a plaintext client, one without a certificate and one
trusting another CA are all refused. `tests/test_node_integration.py` runs
its whole module over the shipped configuration's TLS too."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

import conf
from protocol import pb, pb_grpc
from protocol.tls import ClientTls, TlsError
from protocol.tls import channel as tls_channel
from taproot_ops import admin, tls_init
from tests.conftest import cluster_from
from tests.test_node_parking import uri_on

# -- the configuration -----------------------------------------------------------------------------


@pytest.mark.unit
def test_tls_settings_are_checked():
    for raw, says in (({"tls": {"enabled": True}}, "tls.ca_file: TLS is enabled without auto: set tls.ca_file, "
                                                    "tls.cert_file, tls.key_file"),
                      ({"tls": {"client_certs": True}}, "tls.client_certs: mutual TLS needs tls.enabled = true"),
                      ({"tls": {"enabled": "yes"}}, "tls.enabled: expected bool"),
                      ({"tls": {"ca": "x"}}, "tls.ca: unknown field")):
        with pytest.raises(conf.ConfigError, match=says):
            conf.parse_cluster(raw, {})
    auto = conf.parse_cluster({"tls": {"enabled": True, "auto": True}}, {})
    assert auto.tls.files("/d") == ("/d/tls/ca.pem", "/d/tls/cluster.pem", "/d/tls/cluster-key.pem")
    assert conf.server_tls(conf.parse_cluster({}, {})) is None and conf.client_tls(conf.parse_cluster({}, {})) is None


@pytest.mark.unit
def test_a_file_that_is_not_usable_is_named(tmp_path):
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    config = conf.parse_cluster({"tls": {"enabled": True, "ca_file": str(tmp_path / "ca.pem"),
                                         "cert_file": str(tmp_path / "missing.pem"),
                                         "key_file": str(tmp_path / "key.pem")}}, {})
    with pytest.raises(conf.ConfigError, match=f"tls: CA certificate {tmp_path}/ca.pem: not a PEM file"):
        conf.server_tls(config)
    tls_init.make(tmp_path / "good", ["127.0.0.1"], "t")
    shutil.copy(tmp_path / "good" / "ca.pem", tmp_path / "ca.pem")
    with pytest.raises(conf.ConfigError, match=f"certificate {tmp_path}/missing.pem: cannot be read"):
        conf.server_tls(config)
    with pytest.raises(TlsError, match="needs its key"):
        ClientTls.from_files(str(tmp_path / "ca.pem"), cert_file=str(tmp_path / "good" / "cluster.pem"))


@pytest.mark.unit
def test_a_session_without_tls_takes_it_from_the_environment(tmp_path, monkeypatch):
    from protocol.tls import ENV_CA, ENV_CERT, ENV_KEY
    ca, cert, key = tls_init.make(tmp_path, ["127.0.0.1"], "t")
    for name in (ENV_CA, ENV_CERT, ENV_KEY):
        monkeypatch.delenv(name, raising=False)
    assert ClientTls.from_env() is None
    monkeypatch.setenv(ENV_CA, str(ca))
    assert ClientTls.from_env() == ClientTls(ca.read_bytes())
    monkeypatch.setenv(ENV_CERT, str(cert))
    monkeypatch.setenv(ENV_KEY, str(key))
    assert ClientTls.from_env() == ClientTls(ca.read_bytes(), cert.read_bytes(), key.read_bytes())
    monkeypatch.setenv(ENV_CA, str(tmp_path / "nope.pem"))
    with pytest.raises(TlsError, match="nope.pem: cannot be read"):
        ClientTls.from_env()


@pytest.mark.unit
def test_the_throwaway_certificate_names_every_host_and_its_key_is_private(tmp_path):
    from cryptography import x509

    config = conf.parse_cluster({"nodes": [{"name": "a", "host": "10.1.2.3"}, {"name": "b", "host": "node-b.lan"}],
                                 "tls": {"enabled": True, "auto": True}}, {})
    config = dataclasses.replace(config, data_dir=str(tmp_path))
    assert tls_init.ensure(config) and not tls_init.ensure(config)     # made once
    ca, cert, key = (Path(p) for p in config.tls.files(str(tmp_path)))
    names = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1", "10.1.2.3"}
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "node-b.lan"}
    assert key.stat().st_mode & 0o777 == 0o600
    assert conf.server_tls(config) is not None


# -- a tree with mutual TLS ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    with cluster_from("ha_conf", tmp_path_factory, extra="\n[tls]\nenabled = true\nauto = true\nclient_certs = true\n",
                      with_pipeline=False) as cluster:
        yield cluster


def queue_on(partition: int) -> str:
    return uri_on(partition, 2, domain="demo")


@pytest.mark.integration
def test_the_sdk_reaches_both_nodes_partitions_through_a_proxy_over_mutual_tls(tree):
    from taproot import Session
    from tests.conftest import collect

    tls = tree.client_tls
    assert tls is not None and tls.cert is not None                   # mutual: the client has a certificate
    proxy = tree.proxy_addresses["proxy1"]                             # in front of node1
    with Session([proxy], tls=tls) as session:
        for partition in (0, 1):                                       # node2 leads one: node1 relays to it
            uri = queue_on(partition)
            writer = session.open_queue(uri, write=True)
            reader = session.open_queue(uri, read=True)
            for i in range(20):
                writer.post(f"{partition}-{i}".encode())
            writer.flush()
            assert [m.payload for m in collect(reader, 20, timeout_s=30)] == [f"{partition}-{i}".encode()
                                                                              for i in range(20)]


@pytest.mark.integration
def test_clients_without_the_right_credentials_are_refused(tree, tmp_path, monkeypatch):
    from protocol.tls import ENV_CA
    from taproot import Session
    from taproot.errors import ConnectionError as SessionConnectionError
    monkeypatch.delenv(ENV_CA, raising=False)
    proxy = tree.proxy_addresses["proxy1"]
    ca, _, _ = tree.config.tls.files(tree.data_dir)
    other = tls_init.make(tmp_path / "other", ["127.0.0.1"], "other")
    for name, tls in (("plaintext", None),
                      ("no client certificate", ClientTls.from_files(ca)),
                      ("another CA", ClientTls.from_files(*(str(p) for p in other)))):
        with pytest.raises(SessionConnectionError):
            with Session([proxy], tls=tls, connect_timeout_s=2.0, reconnect=False) as session:
                session.open_queue(queue_on(0), write=True)
            pytest.fail(f"{name}: connected")


@pytest.mark.integration
def test_admin_and_the_pipelines_notice_go_over_tls_too(tree, capsys):
    from taproot_ops.cli import main

    node1 = tree.node_addresses["node1"]
    assert admin.call(node1, "status").code.name == "NOT_CONNECTED"                  # plaintext
    answer = admin.call(node1, "status", tls=tree.client_tls)
    assert answer.ok and answer.data is not None and answer.data["name"] == "node1"
    code = main(["admin", "--config", str(tree.config_path), "--data-dir", tree.data_dir, f"--host={node1}",
                 "--json", "status"])
    assert code == 0 and '"name": "node1"' in capsys.readouterr().out

    notice = pb.DeliveryNotice(partition=0)
    pb_grpc.BrokerStub(tls_channel(node1, tree.client_tls)).NotifyDelivery(notice, timeout=10)   # answered
    import grpc
    with pytest.raises(grpc.RpcError):
        pb_grpc.BrokerStub(tls_channel(node1, None)).NotifyDelivery(notice, timeout=5)
