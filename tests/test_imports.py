"""The house rules, as each package's docstring states them, checked against
the imports of every module:

    Imports: conf, protocol.          the Taproot packages it may import
    Never: pyspark, delta.            what it must not import (directly or not)
    Pure: relay.                      its pure cores: no threads, no I/O, no clock

A pure core may import only the standard library's data-structure modules,
pyarrow/numpy/protobuf, and other pure cores; loading it must not load gRPC,
Delta or Spark. The SDK (`taproot` with `protocol`) must load without the
server extra's packages.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "taproot", "conf", "storage", "pipelines", "replicas", "proxies", "primary", "taproot_ops")
# Standard-library modules that do I/O, threads or time: never in a pure core.
IMPURE_STDLIB = {"threading", "time", "socket", "subprocess", "asyncio", "concurrent", "queue", "os", "signal",
                 "select", "selectors", "multiprocessing", "shutil", "tempfile", "random", "urllib.request"}
HEAVY = ("grpc", "deltalake", "pyspark", "delta")


def rules(package: str) -> dict[str, set[str]]:
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text())) or ""
    found: dict[str, set[str]] = {}
    for key in ("Imports", "Never", "Pure"):
        match = re.search(rf"^{key}: (.*)$", doc, re.M)
        if match:
            text = re.sub(r"\(.*?\)", "", match.group(1)).rstrip(".")
            found[key] = {name.strip() for name in text.split(",") if name.strip()}
    return found


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if not p.name.endswith("_pb2_grpc.py"))


@functools.lru_cache(maxsize=None)   # the rules' tests read every module: parse each once
def imported(path: Path) -> frozenset[str]:
    """Every module an `import` or `from ... import` names, at any depth
    (function-level imports too), except under `if TYPE_CHECKING:`."""
    names: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:   # one walk, not descending into `if TYPE_CHECKING:` (its `else:` is walked)
        node = stack.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If) and any(getattr(n, "id", getattr(n, "attr", None)) == "TYPE_CHECKING"
                                              for n in ast.walk(node.test)):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return frozenset(names)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_package_states_its_rules():
    for package in PACKAGES:
        assert "Imports" in rules(package), f"{package}/__init__.py: no 'Imports:' line in its docstring"


def test_each_module_imports_only_the_packages_its_package_allows():
    broken = []
    for package in PACKAGES:
        allowed = rules(package)["Imports"] | {package}
        for path in modules(package):
            for name in imported(path):
                top = name.split(".")[0]
                if top in PACKAGES and top not in allowed:
                    broken.append(f"{path.relative_to(ROOT)} imports {name} (allowed: {sorted(allowed)})")
    assert not broken, "\n".join(broken)


def test_no_module_imports_what_its_package_never_may():
    broken = []
    for package in PACKAGES:
        never = rules(package).get("Never", set())
        for path in modules(package):
            for name in imported(path):
                if name.split(".")[0] in never:
                    broken.append(f"{path.relative_to(ROOT)} imports {name} (never: {sorted(never)})")
    assert not broken, "\n".join(broken)


def pure_modules() -> list[str]:
    return [f"{package}.{name}" for package in PACKAGES for name in sorted(rules(package).get("Pure", ()))]


def test_pure_cores_import_no_threads_io_or_clock_and_only_other_pure_taproot_modules():
    pure = set(pure_modules())
    assert len(pure) >= 10
    broken = []
    for name in sorted(pure):
        path = ROOT / (name.replace(".", "/") + ".py")
        assert path.exists(), f"{name} is listed as pure but does not exist"
        for imp in imported(path):
            top = imp.split(".")[0]
            if imp in IMPURE_STDLIB or top in IMPURE_STDLIB or top in HEAVY:
                broken.append(f"{name} imports {imp}")
            elif top in PACKAGES and imp not in pure and imp != top and imp.rsplit(".", 1)[0] not in pure \
                    and not (imp.rsplit(".", 1)[0] == top):
                broken.append(f"{name} imports {imp}, which is not a pure core")
    assert not broken, "\n".join(broken)


def loaded_by(statement: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys; {statement}; print(' '.join(sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {m.split(".")[0] for m in out.split()}


# One interpreter start for every pure core: a process that has imported
# none of Taproot's modules forks a child per module, which imports it and
# says what it loaded (numpy, for one, cannot be unloaded and imported again
# in one process). The process has numpy, pyarrow and protobuf loaded first,
# which load none of HEAVY (said on its first line): the children do not
# import them 19 times, and anything of HEAVY a module loads still shows.
EACH_ALONE = """
import importlib, json, os, sys
import numpy, pyarrow, google.protobuf
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
start = set(sys.modules)
loaded = {}
for name in sys.argv[1:]:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            said = sorted({m.split(".")[0] for m in set(sys.modules) - start})
        except BaseException as exc:
            said = f"{type(exc).__name__}: {exc}"
        os.write(write, json.dumps(said).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        loaded[name] = json.loads(answer.read())
    os.wait()
print(json.dumps(loaded))
"""


def test_loading_a_pure_core_loads_no_grpc_delta_or_spark():
    names = pure_modules()
    out = subprocess.run([sys.executable, "-c", EACH_ALONE, *names], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    preloaded, loaded = (json.loads(line) for line in out.splitlines())
    assert "numpy" in preloaded and not set(HEAVY) & set(preloaded), preloaded
    assert sorted(loaded) == sorted(names)
    assert not [said for said in loaded.values() if isinstance(said, str)], loaded   # each one imported
    broken = [f"import {name} loads {sorted(set(HEAVY) & set(tops))}" for name, tops in loaded.items()
              if set(HEAVY) & set(tops)]
    assert not broken, "\n".join(broken)


def test_the_sdk_loads_without_the_server_extra():
    loaded = loaded_by("import taproot.session, taproot.core, protocol.columns")
    assert not loaded & {"deltalake", "pyspark", "delta", "pandas", "conf", "storage", "primary", "pipelines",
                         "replicas", "proxies", "taproot_ops"}


def test_a_node_does_not_load_the_sdk():
    assert "taproot" not in loaded_by("import primary.server, proxies.server")


def test_the_checker_sees_a_broken_rule(tmp_path):
    """Not vacuous: a pure core that reads the clock, and a package importing
    one it may not, are both caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nfrom primary.node import Node\ndef f():\n    import grpc\n")
    names = imported(bad)
    assert {"time", "primary.node", "grpc"} <= names
    assert rules("protocol")["Imports"] == set() and "retransmit" in rules("protocol")["Pure"]
