"""What commands say while they work (`taproot_ops.console`), and a
command that checks what it needs before it starts (`bench --compare`)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from taproot_ops import console

pytestmark = pytest.mark.unit

CONSOLE = Path(console.__file__)


def test_a_wait_without_a_terminal_says_what_it_waits_for_and_how_long_it_took(monkeypatch):
    out = io.StringIO()
    with console.Waiting("fetching jars", usually_s=60, stream=out) as waiting:
        waiting.note("3 of 5")
    lines = out.getvalue().splitlines()
    assert lines[0] == "   fetching jars (usually about 60 s)..."
    assert lines[-1].startswith("   fetching jars: done in 0 s, 3 of 5")
    assert "\r" not in out.getvalue()


def test_a_wait_that_fails_or_is_interrupted_says_so():
    out = io.StringIO()
    with pytest.raises(ValueError):
        with console.Waiting("x", stream=out):
            raise ValueError("no")
    with pytest.raises(KeyboardInterrupt):
        with console.Waiting("y", stream=out):
            raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-3:] == ["   x: failed after 0 s", "   y...", "   y: interrupted after 0 s"]


def test_a_line_said_during_a_live_wait_goes_above_it(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    with console.Waiting("building", stream=out):
        console.say("a role logged an error", out)
    text = out.getvalue()
    said = text.index("a role logged an error\n")
    # The live line is cleared before the line and drawn again after it.
    assert text.rindex("\r", 0, said) < said and "| building: 0 s" in text[said:]
    assert text.endswith("building: done in 0 s\n")


def test_a_logged_step_keeps_the_tools_output_in_the_log_and_shows_its_end_when_it_fails(tmp_path):
    log = tmp_path / "setup.log"
    ok = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "step one", "--",
                         sys.executable, "-c", "print('noise ' * 5)"], capture_output=True, text=True)
    assert ok.returncode == 0 and "noise" not in ok.stdout + ok.stderr
    assert "step one: done in" in ok.stdout and "noise noise" in log.read_text()
    bad = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "step two", "--",
                          sys.executable, "-c", "import sys; print('why it failed'); sys.exit(3)"],
                         capture_output=True, text=True)
    assert bad.returncode == 3
    assert "why it failed" in bad.stderr and f"step two failed (exit 3); its whole output is in {log}" in bad.stderr
    assert "step two: failed after 0 s" in bad.stdout
    usage = subprocess.run([sys.executable, str(CONSOLE), "--log", str(log), "--what", "x"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and "no command given" in usage.stderr and "Traceback" not in usage.stderr


def test_without_a_terminal_taking_the_foreground_is_a_no_op():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from taproot_ops.console import Terminal; "
            "t = Terminal(); print(t.take()); t.restore()")
    out = subprocess.run([sys.executable, "-c", code, str(CONSOLE.parents[1])], capture_output=True, text=True,
                         start_new_session=True)   # no controlling terminal
    assert out.stdout.strip() == "False", out.stderr


def test_bench_compare_checks_the_peers_clients_before_it_starts(monkeypatch):
    from taproot_ops.bench import peers

    monkeypatch.setattr(peers, "ensure_installed", lambda system: None)
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(peers.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for pika>=1.3"))
    with pytest.raises(peers.PeerSetupError) as raised:
        peers.prepare("rabbitmq")
    said = str(raised.value)
    assert "No matching distribution" in said and "-m pip install 'pika>=1.3'" in said
