"""The pipeline yields the CPU to the node and the proxy (`[pipeline]
cpu_nice`, `pipelines.priority.yield_cpu`): its process's nice, inherited by
the JVM, and its session's autogroup only when it leads that session.

Each case runs in a child process: a nice cannot be raised back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

import conf
from pipelines.priority import LagGovernor, autogroup_nice, lag_governor

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
    if result["group"] is not None:     # the child's new session has an autogroup (this kernel has them)
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


def test_the_shipped_pipeline_takes_a_full_share_past_60_s_of_lag(tmp_path):
    assert conf.load(None, data_dir="/tmp/unused").pipeline.cpu_full_share_lag_s == 60
    shipped = (ROOT / "conf" / "cluster.toml").read_text()
    path = tmp_path / "cluster.toml"
    path.write_text(shipped.replace("cpu_full_share_lag_s = 60", "cpu_full_share_lag_s = -5"))
    with pytest.raises(conf.ConfigError, match="pipeline.cpu_full_share_lag_s"):
        conf.load(str(path), data_dir=str(tmp_path / "data"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_governor_gives_the_share_back_while_behind_and_yields_again_once_caught_up(tmp_path):
    """Past the bound the autogroup goes to nice 0; it returns to cpu_nice only
    under half the bound, and no change follows another within the dwell."""
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-1 nice 19\n")
    clock = Clock()
    governor = LagGovernor(19, 30, autogroup=str(group), dwell_s=5, clock=clock)
    assert governor.observe(29.9) is None and group.read_text().startswith("/autogroup")
    said = governor.observe(30.0)
    assert said is not None and "full CPU share" in said and group.read_text() == "0"
    assert governor.full_share and governor.changes == 1
    clock.now = 1
    assert governor.observe(1.0) is None                  # within the dwell: no change yet
    clock.now = 6
    assert governor.observe(15.1) is None                 # caught up only to more than half the bound
    said = governor.observe(15.0)
    assert said is not None and "yields the CPU again" in said and group.read_text() == "19"
    assert not governor.full_share and governor.changes == 1
    clock.now = 20
    governor.observe(45)
    assert group.read_text() == "0" and governor.changes == 2


def test_a_change_the_kernel_refuses_is_said_and_tried_again(tmp_path):
    """The kernel takes one autogroup change every 100 ms (EAGAIN); an
    unwritable file stands in for that. Nothing raises, the log hears it
    once, and each observation tries again."""
    governor = LagGovernor(19, 30, autogroup=str(tmp_path / "gone" / "autogroup"), dwell_s=5, clock=Clock())
    said = governor.observe(60)
    assert said is not None and "stays" in said and not governor.full_share
    assert governor.observe(61) is None and not governor.full_share    # the same refusal is not said again
    (tmp_path / "gone").mkdir()
    said = governor.observe(60)
    assert said is not None and "stays" not in said and governor.full_share


def test_no_governor_without_yielding_a_bound_or_an_autogroup_of_ones_own(tmp_path):
    assert lag_governor(0, 30) is None and lag_governor(19, 0) is None
    assert lag_governor(19, 30, autogroup=str(tmp_path / "missing")) is None
    assert lag_governor(19, 30) is None          # pytest does not lead its session


GOVERN = """
import json, sys
from pipelines.priority import autogroup_nice, lag_governor, yield_cpu
yield_cpu(9)
governor = lag_governor(9, 30)
if governor is None:
    print(json.dumps(dict(group=autogroup_nice(), seen=None)))
    raise SystemExit
seen = [autogroup_nice()]
governor.dwell_s = 0.2
governor.observe(31)
seen.append(autogroup_nice())
import time; time.sleep(0.3)
governor.observe(2)
seen.append(autogroup_nice())
print(json.dumps(dict(group=seen[0], seen=seen)))
"""


def test_a_session_leader_can_take_its_share_back_and_yield_again():
    """On this kernel, unprivileged: the autogroup nice goes 9 -> 0 -> 9
    (a process's own nice could not come back down)."""
    out = subprocess.run([sys.executable, "-c", GOVERN], cwd=ROOT, check=True, capture_output=True, text=True,
                         start_new_session=True, timeout=60)
    result = json.loads(out.stdout)
    # Judged by the child's own session, not pytest's: a runner that never
    # called setsid leaves pytest in the default autogroup (an empty file)
    # while the child's setsid gives it one of its own.
    if result["group"] is None:       # no autogroup for the child's session: no governor either
        assert result["seen"] is None
    else:
        assert result["seen"] == [9, 0, 9]


def test_the_lag_is_the_oldest_row_judged_late_or_the_age_of_what_waits():
    from pipelines.runner import AuthorityLag

    def at(seconds: float) -> str:
        return f"2026-11-29T19:00:{seconds:06.3f}Z"

    base = datetime.fromisoformat("2026-11-29T19:00:00+00:00").timestamp()
    lag = AuthorityLag(since=base)
    assert lag.now_s(running=False, now=base + 5) == 0.0
    assert lag.now_s(running=True, now=base + 5) == 5.0      # the first batch, still running
    # Rows committed from 0.5 to 9.0 s, judged by a batch that started at 10 and took 4 s.
    lag.batch({"timestamp": at(10), "numInputRows": 900, "durationMs": {"triggerExecution": 4000},
               "eventTime": {"min": at(0.5), "max": at(9.0), "watermark": at(0)}})
    assert lag.now_s(running=False, now=base + 14) == pytest.approx(13.5)
    # The next batch runs: what it judges was committed after 10 s (the trigger's start).
    assert lag.now_s(running=True, now=base + 30) == pytest.approx(20.0)
    # A trigger that found nothing: nothing waits.
    lag.batch({"timestamp": at(40), "numInputRows": 0, "durationMs": {"triggerExecution": 3},
               "eventTime": {"watermark": at(0)}})
    assert lag.now_s(running=False, now=base + 41) == 0.0
    assert lag.now_s(running=True, now=base + 41) == pytest.approx(1.0)
    lag.batch({"numInputRows": 5})          # a report without its fields changes nothing
    assert lag.now_s(running=False, now=base + 41) == 0.0
