"""Every Python snippet of the README runs as written against the cluster
`make run` starts: the shipped configuration (its ports, TLS and token
auth on), run from a directory whose `data/` is that cluster's, with the
environment the README tells the reader to export. No pipeline: the
snippets need none (the express lane delivers)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from taproot_ops.embedded import EmbeddedCluster

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[1] / "README.md"
# The shipped cluster.toml's node and proxy, and their metrics (port + 10).
SHIPPED_PORTS = (30114, 30115, 30124, 30125)
# What the README says to export, as it says it.
README_ENV = {"TAPROOT_TLS_CA_FILE": "data/tls/ca.pem", "TAPROOT_TOKEN_FILE": "data/auth/local.token"}


def python_snippets() -> list[tuple[int, str]]:
    """(line, code) of each ```python block of the README."""
    text = README.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)]


def test_the_readme_has_the_snippets_and_says_what_to_export():
    assert len(python_snippets()) >= 5
    exports = re.search(r"^export (TAPROOT_\S+=\S+(?: TAPROOT_\S+=\S+)*)$", README.read_text(), flags=re.M)
    assert exports is not None
    assert dict(pair.split("=", 1) for pair in exports.group(1).split()) == README_ENV


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    busy = [p for p in SHIPPED_PORTS if _in_use(p)]
    if busy:
        pytest.skip(f"the shipped configuration's ports {busy} are taken (is `make run` running?)")
    root = tmp_path_factory.mktemp("readme")
    cluster = EmbeddedCluster(None, str(root / "data"), with_pipeline=False)
    cluster.start()
    try:
        yield root
    finally:
        cluster.stop()


@pytest.mark.parametrize("line,code", python_snippets(), ids=[f"README.md:{n}" for n, _ in python_snippets()])
def test_a_readme_snippet_runs_as_written(shipped, line, code):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAPROOT_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=shipped, env={**env, **README_ENV},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"README.md:{line}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    assert "Traceback" not in out.stderr, out.stderr
    if "print(" in code:
        assert out.stdout.strip(), f"README.md:{line} printed nothing"
