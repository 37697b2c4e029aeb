"""Fuzz tier, configuration: random and mutated cluster and domain files
against the loader. Whatever the bytes, loading ends in a valid
configuration or a `ConfigError` naming the file, never another exception.

Hypothesis makes the inputs: documents built from the real section and
field names with values of every TOML type and range, and the shipped files
with bytes flipped, cut, repeated or inserted. The short run is derandomized
(the same inputs every run); `pytest --long` runs many more, at random.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conf

SHIPPED = conf.PACKAGE_DIR
SECTIONS = {
    "cluster": conf.ClusterConfig, "primary": conf.PrimaryConfig, "pipeline": conf.PipelineConfig,
    "maintenance": conf.MaintenanceConfig, "ha": conf.HaConfig, "nodes": conf.NodeConfig,
    "proxies": conf.ProxyConfig,
}
DOMAIN_FIELDS = [f.name for f in dataclasses.fields(conf.DomainConfig)]
SAMPLES = [SHIPPED / "cluster.toml", *sorted((SHIPPED / "domains").glob("*.toml")),
           *sorted((Path(__file__).resolve().parent / "cluster_conf" / "domains").glob("*.toml"))]
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


# -- TOML out of Python values ---------------------------------------------------
def toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "-_" for c in key) and key.isascii() else json.dumps(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (int, str)):
        return str(value) if isinstance(value, int) else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(sections: dict[str, object]) -> str:
    lines = []
    for name, body in sections.items():
        if isinstance(body, dict):
            lines.append(f"[{toml_key(name)}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in body.items()]
        elif isinstance(body, list) and body and all(isinstance(b, dict) for b in body):
            for table in body:
                lines.append(f"[[{toml_key(name)}]]")
                lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]  # type: ignore[union-attr]
        else:
            lines.append(f"{toml_key(name)} = {toml_value(body)}")
    return "\n".join(lines) + "\n"


EDGE_INTS = [0, 1, -1, 2, 100, 2**31 - 1, 2**31, 2**32, 2**50, 2**63 - 1, -(2**63)]
scalars = st.one_of(
    st.booleans(), st.sampled_from(EDGE_INTS), st.integers(-(2**63), 2**63 - 1), st.floats(),
    st.text(max_size=30),
    st.sampled_from(["priority", "fanout", "broadcast", "express", "pipeline", "fsync", "os", "node1",
                     "127.0.0.1", "", "x" * 300, "a > 1", "region = 'EU'", "((((", "app1"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def fields_of(cls: type, extra: list[str] | None = None) -> st.SearchStrategy[dict[str, object]]:
    names = [f.name for f in dataclasses.fields(cls)] + (extra or [])
    return st.dictionaries(st.one_of(st.sampled_from(names), st.text(max_size=12)), values, max_size=6)


section_bodies = st.one_of(
    *[st.tuples(st.just(name), st.lists(fields_of(cls), max_size=3) if name in ("nodes", "proxies")
                else fields_of(cls)) for name, cls in SECTIONS.items()],
    st.tuples(st.text(max_size=10), values))
cluster_documents = st.lists(section_bodies, max_size=7).map(lambda pairs: toml_document(dict(pairs)))
domain_documents = fields_of(conf.DomainConfig, ["app_ids", "subscriptions"]).map(
    lambda body: "\n".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in body.items()) + "\n")


@st.composite
def mutated(draw: st.DrawFn, sample: Path | None = None) -> bytes:
    """A shipped file with a few bytes flipped, cut, repeated or inserted."""
    data = bytearray((sample or draw(st.sampled_from(SAMPLES))).read_bytes())
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["flip", "cut", "repeat", "insert", "truncate"]))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 40))]
        elif op == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 200))] * draw(st.integers(1, 50))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=20) | st.sampled_from(
                [b"[", b"]]", b"=", b'"', b"\n[ha]\n", b"\xff\xfe", b"[" * 2000, b"0" * 30, b"-", b"\x00"]))
        else:
            del data[at:]
    return bytes(data)


# -- the properties -----------------------------------------------------------------
def load_cluster(cluster_text: bytes, domain_text: bytes | None = None) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "cluster.toml").write_bytes(cluster_text)
        if domain_text is not None:
            (root / "domains").mkdir()
            (root / "domains" / "fuzzed.toml").write_bytes(domain_text)
        try:
            config = conf.load(root / "cluster.toml")
        except conf.ConfigError as exc:
            assert str(root) in str(exc), f"the error names no file: {exc}"
            return
        # What loads is whole: the checks that span fields held.
        assert config.ha.lease_renew_interval_ms * 2 <= config.ha.lease_duration_ms
        assert config.nodes and len({n.name for n in config.nodes}) == len(config.nodes)
        for domain in config.domains.values():
            assert domain.mode in conf.QUEUE_MODES and domain.delivery in conf.DELIVERY_MODES


@FUZZ
@given(cluster_documents)
def test_a_generated_cluster_file_loads_or_is_a_config_error(text):
    load_cluster(text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(mutated())
def test_a_mutated_shipped_file_loads_or_is_a_config_error(data):
    load_cluster(data)


@FUZZ
@given(st.one_of(domain_documents.map(lambda t: t.encode("utf-8", "surrogatepass")), mutated()))
def test_a_generated_or_mutated_domain_file_loads_or_is_a_config_error(data):
    load_cluster(b"", data)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_either_file_are_a_config_error_or_load(data):
    load_cluster(data)
    load_cluster(b"", data)
