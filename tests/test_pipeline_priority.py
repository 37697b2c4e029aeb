"""The pipeline yields the CPU to the node and the proxy (`[pipeline]
cpu_nice`, `pipelines.priority.yield_cpu`): its process's nice, inherited by
the JVM, and its session's autogroup only when it leads that session.

Each case runs in a child process: a nice cannot be raised back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import conf
from pipelines.priority import autogroup_nice

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, sys
from pipelines.priority import autogroup_nice, yield_cpu
said = yield_cpu(int(sys.argv[1]), sys.argv[2])
group = autogroup_nice()
child = int(os.popen("nice").read())   # a child (the JVM) inherits it: `nice` alone prints its own
print(json.dumps(dict(said=said, nice=os.nice(0), child=child, group=group)))
"""


def probe(nice: int, *, own_session: bool, autogroup: str = "/proc/self/autogroup") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(nice), autogroup], cwd=ROOT, check=True,
                         capture_output=True, text=True, start_new_session=own_session, timeout=60)
    return json.loads(out.stdout)


def test_the_shipped_pipeline_yields_the_cpu():
    assert conf.load(None, data_dir="/tmp/unused").pipeline.cpu_nice == 19


def test_a_session_leader_lowers_its_nice_and_its_autogroup():
    result = probe(7, own_session=True)
    assert result["nice"] == 7 and result["child"] == 7
    assert "nice 7" in result["said"]
    if autogroup_nice() is not None:     # a kernel with autogroups
        assert result["group"] == 7 and "autogroup nice 7" in result["said"]


def test_inside_someone_elses_session_the_autogroup_is_left_alone():
    before = autogroup_nice()
    result = probe(5, own_session=False)
    assert result["nice"] == 5 and result["child"] == 5
    assert "autogroup" not in result["said"]
    assert autogroup_nice() == before and result["group"] == before


def test_no_autogroups_and_zero_change_nothing_and_never_raise(tmp_path):
    result = probe(3, own_session=True, autogroup=str(tmp_path / "missing"))
    assert result["nice"] == 3 and "autogroup" not in result["said"]
    empty = tmp_path / "empty"      # what some sandboxes (gVisor) show for /proc/self/autogroup
    empty.write_text("")
    result = probe(3, own_session=True, autogroup=str(empty))
    assert result["nice"] == 3 and "autogroup" not in result["said"] and empty.read_text() == ""
    assert autogroup_nice(str(empty)) is None and autogroup_nice(str(tmp_path / "missing")) is None
    result = probe(0, own_session=True)
    assert result["nice"] == os.nice(0) and result["said"] == "CPU priority unchanged (cpu_nice = 0)"


def test_a_lower_nice_than_the_current_one_is_kept(tmp_path):
    """Started at nice 10 (by `nice -n 10`, say), cpu_nice 4 does not raise the priority back."""
    out = subprocess.run(["nice", "-n", "10", sys.executable, "-c", PROBE, "4", str(tmp_path / "none")],
                         cwd=ROOT, check=True, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["nice"] == 10


@pytest.mark.parametrize("value", [-1, 20])
def test_cpu_nice_out_of_range_is_a_config_error(tmp_path, value):
    shipped = (ROOT / "conf" / "cluster.toml").read_text()
    path = tmp_path / "cluster.toml"
    path.write_text(shipped.replace("cpu_nice = 19", f"cpu_nice = {value}"))
    with pytest.raises(conf.ConfigError, match="pipeline.cpu_nice"):
        conf.load(str(path), data_dir=str(tmp_path / "data"))
