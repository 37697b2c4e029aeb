"""The bench waits out a file system's slow creates after the last run's
clean-up (`taproot_ops.bench.settling`), and only where it must (unit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taproot_ops.bench import settling as settle_mod


def _fake_block(tmp_path: Path, devname: str, ext4: bool, journals: list[str]) -> tuple[str, str, str]:
    """A /sys and /proc that describe the device `tmp_path` lives on."""
    st = os.stat(tmp_path)
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    block = sys_root / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    block.mkdir(parents=True)
    (block / "uevent").write_text(f"MAJOR={os.major(st.st_dev)}\nMINOR={os.minor(st.st_dev)}\nDEVNAME={devname}\n")
    if ext4:
        (proc_root / "fs" / "ext4" / devname).mkdir(parents=True)
    for j in journals:
        (proc_root / "fs" / "jbd2" / j).mkdir(parents=True)
    return str(tmp_path), str(sys_root), str(proc_root)


@pytest.mark.unit
@pytest.mark.parametrize("ext4, journals, slow", [
    (True, [], True),                      # ext4 without a journal: the case the module is for
    (True, ["vda1-8"], False),             # journaled ext4
    (True, ["vda10-8"], True),             # another device's journal does not count
    (False, [], False),                    # not ext4 (xfs, tmpfs, overlay ...)
])
def test_slow_creates_only_on_ext4_without_a_journal(tmp_path, ext4, journals, slow):
    path, sys_root, proc_root = _fake_block(tmp_path, "vda1", ext4, journals)
    assert settle_mod.slow_creates_after_deletes(path, sys_root, proc_root) is slow


@pytest.mark.unit
def test_an_unknown_device_is_not_slow(tmp_path):
    assert settle_mod.slow_creates_after_deletes(str(tmp_path), str(tmp_path / "nosys"), str(tmp_path)) is False
    assert settle_mod.slow_creates_after_deletes(str(tmp_path / "missing")) is False


@pytest.fixture
def marked(tmp_path, monkeypatch):
    """`MARK` in a temp dir, and the file system taken as slow."""
    monkeypatch.setattr(settle_mod, "MARK", tmp_path / "tidied")
    monkeypatch.setattr(settle_mod, "slow_creates_after_deletes", lambda path: True)
    return tmp_path / "tidied"


@pytest.mark.unit
def test_settle_waits_the_rest_of_the_window_after_a_tidy(tmp_path, marked):
    small = tmp_path / "short-run"
    small.mkdir()
    (small / "f").write_text("x")
    settle_mod.tidy(small)
    assert not small.exists() and not marked.exists()   # a few files deleted: nothing to wait for
    work = tmp_path / "run"
    (work / "data").mkdir(parents=True)
    for i in range(settle_mod.TIDY_MIN_FILES):
        (work / "data" / f"f{i}").write_bytes(b"")
    settle_mod.tidy(work)
    assert not work.exists() and marked.exists()
    tidied_at = marked.stat().st_mtime
    slept: list[float] = []
    said: list[str] = []
    waited = settle_mod.settle(str(tmp_path), now=lambda: tidied_at + 10.0, sleep=slept.append, say=said.append)
    assert waited == pytest.approx(settle_mod.SETTLE_S - 10.0)
    assert slept == [pytest.approx(settle_mod.SETTLE_S - 10.0)]
    assert len(said) == 1 and "waiting 35 s" in said[0] and "10 s ago" in said[0]


@pytest.mark.unit
def test_settle_does_not_wait_once_the_window_passed_or_without_a_tidy(tmp_path, marked):
    def never(_s: float) -> None:
        raise AssertionError("slept")

    assert settle_mod.settle(str(tmp_path), sleep=never, say=lambda _t: None) == 0.0   # no tidy yet
    marked.touch()
    at = marked.stat().st_mtime
    assert settle_mod.settle(str(tmp_path), now=lambda: at + settle_mod.SETTLE_S + 1, sleep=never) == 0.0


@pytest.mark.unit
def test_settle_does_not_wait_where_creates_are_not_slow(tmp_path, monkeypatch):
    monkeypatch.setattr(settle_mod, "MARK", tmp_path / "tidied")
    monkeypatch.setattr(settle_mod, "slow_creates_after_deletes", lambda path: False)
    (tmp_path / "tidied").touch()
    at = (tmp_path / "tidied").stat().st_mtime

    def never(_s: float) -> None:
        raise AssertionError("slept")
    assert settle_mod.settle(str(tmp_path), now=lambda: at + 1, sleep=never) == 0.0
