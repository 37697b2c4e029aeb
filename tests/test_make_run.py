"""`make run` as a person runs it: in a terminal (a pseudo-terminal here),
reading the screen, then Ctrl-C. Checked: a live line during every wait
(and, during Spark's start, one that keeps counting), the first message
delivered within seconds of "serving", the pipeline's decisions and the
table step, no traceback and no set-up noise, and a clean Ctrl-C: make
exits 0 and no process of the cluster is left behind."""

from __future__ import annotations

import io
import os
import re
import socket
import time
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = [pytest.mark.integration, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PORTS = (30114, 30115, 30124, 30125, 30126, 30127)
SPINNER = r"[|/\-\\]"


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _left_behind(marker: str) -> list[str]:
    """Command lines of the processes that mention `marker` (the data directory)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def _live_values(screen: str, what: str) -> list[int]:
    """The seconds shown on the live line of the wait `what`, each redraw."""
    return [int(n) for n in re.findall(rf"\r {{0,3}}{SPINNER} {re.escape(what)}: (\d+) s", screen)]


def _ask_the_endpoint(data: str, env: dict[str, str]) -> tuple[float, str, str]:
    """`taproot sql` against the running cluster (seconds, what it printed),
    and the code a Spark Connect client without the token meets."""
    import subprocess
    import sys

    from taproot_ops.sparkconnect.client import ConnectError, Endpoint

    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "sql", "--data-dir", data, "--json",
                          "SELECT count(*) AS n FROM taproot_puts"], cwd=str(REPO), env=env,
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert out.returncode == 0 and "starting Spark" not in out.stderr, out.stderr[-2000:]
    with Endpoint("sc://127.0.0.1:30127") as anonymous:
        try:
            anonymous.sql("SELECT 1")
            refused = "answered"
        except ConnectError as exc:
            refused = exc.code
    return took, out.stdout.strip(), refused


def test_make_run_in_a_terminal_then_ctrl_c(tmp_path):
    busy = [p for p in SHIPPED_PORTS if _in_use(p)]
    if busy:
        pytest.skip(f"the shipped configuration's ports {busy} are taken (is `make run` running?)")
    data = str(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAPROOT_", "MAKE", "MFLAGS"))}
    env["TERM"] = "xterm"
    screen = io.StringIO()
    child = pexpect.spawn("make", ["run", f"RUN_ARGS=--data-dir {data}"], cwd=str(REPO), env=env,
                          encoding="utf-8", codec_errors="replace", dimensions=(50, 200), timeout=240)
    child.logfile_read = screen
    try:
        child.expect("== serving on")
        serving = time.monotonic()
        child.expect(r"the first message was delivered ([\d,]+) ms after its PUT, ([\d.]+) s after the cluster "
                     "began serving", timeout=60)
        first_ms, first_after_s = int(child.match.group(1).replace(",", "")), float(child.match.group(2))
        seen_after_s = time.monotonic() - serving
        child.expect(r"the pipeline wrote ([\d,]+) delivery rows")
        decided = int(child.match.group(1).replace(",", ""))
        child.expect("Ctrl-C stops the cluster.")
        sql_s, counted_rows, refused = _ask_the_endpoint(data, env)
        child.sendintr()
        child.expect(pexpect.EOF, timeout=90)
    finally:
        child.close(force=True)
        print(screen.getvalue()[-6000:])
    text = screen.getvalue()
    print(f"first delivery: {first_ms} ms after its PUT, {first_after_s} s after serving "
          f"(read on the screen {seen_after_s:.1f} s after it)")

    # Ctrl-C: the launcher stops the cluster and make ends as it does, exit 0.
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert "stopping the cluster" in text and "make: ***" not in text
    deadline = time.monotonic() + 10
    while _left_behind(data) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _left_behind(data)

    # The Spark Connect endpoint, as shipped ([auth] on): `taproot sql` finds
    # its token in the state directory; a client with none is refused.
    print(f"taproot sql on the endpoint: {sql_s:.2f} s")
    assert counted_rows == '{"n":2006}'        # the demo's 2,000 and its fanout's 6
    assert refused == "UNAUTHENTICATED"

    # The first delivery comes within seconds of "serving" (the express lane; Spark still starting).
    assert first_after_s < 5 and first_ms < 2000
    assert seen_after_s < 20
    assert decided == 2000
    assert "2,000 rows of demo/orders from this run" in text     # the table step, with delta-rs

    # A live line during every wait, and Spark's keeps counting.
    for what in ("starting node1, proxy1", "posting and consuming", "Spark starting and warming up",
                 "the pipeline deciding the demo's messages"):
        assert _live_values(text, what), f"no live line while {what!r}"
        assert f"{what}: done in" in text
    counted = sorted(set(_live_values(text, "Spark starting and warming up")))
    assert len(counted) >= 5 and counted[-1] >= 5, counted

    # Quiet: no traceback, no Ivy resolution lines, no error line from a role.
    assert "Traceback" not in text
    assert not re.search(r":: resolving dependencies|confs: \[default\]|found io\.delta#|BuildBackendWarning", text)
    assert "   ! " not in text, [line for line in text.splitlines() if "   ! " in line]
