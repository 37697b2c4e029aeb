"""Kernel names for a server's threads (`protocol.thread_names`), each case in
a process of its own: `install` changes `threading.Thread` for the whole
process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from protocol.thread_names import NAME_BYTES, kernel_name

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_NAME) is Linux's")]

# Threads started before and after `install`, each reporting the kernel's
# name for itself (/proc/self/task/<tid>/comm), and the main thread's.
SCRIPT = textwrap.dedent("""
    import json, sys, threading
    from protocol import thread_names

    def comm():
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            return f.read().rstrip("\\n")

    def started(name):
        seen = {}
        thread = threading.Thread(target=lambda: seen.setdefault("comm", comm()), name=name)
        thread.start()
        thread.join()
        return seen["comm"]

    main = comm()
    before = started("commit-puts-0")
    installed = [thread_names.install() for _ in range(int(sys.argv[1]))]
    print(json.dumps({"main": main, "main_after": comm(), "before": before, "installed": installed,
                      "after": [started(n) for n in sys.argv[2:]]}))
""")


def _run(installs: int, *names: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(installs), *names],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_threads_started_after_install_carry_their_names_to_the_kernel() -> None:
    seen = _run(1, "commit-puts-0", "checkpoint-confirms", "grpc-loop")
    assert seen["installed"] == [True]
    assert seen["after"] == ["commit-puts-0", "checkpoint-conf", "grpc-loop"]   # cut to 15 bytes
    assert seen["before"] == seen["main"]            # started before: the process's name, as Python leaves it
    assert seen["main_after"] == seen["main"]        # the main thread is not renamed


def test_install_twice_names_once() -> None:
    seen = _run(2, "compact-puts-0")
    assert seen["installed"] == [True, True]
    assert seen["after"] == ["compact-puts-0"]
    # `install` checks for its own wrapper: a second call must not wrap it again.
    script = ("import threading; from protocol import thread_names; thread_names.install(); "
              "run = threading.Thread.run; thread_names.install(); print(threading.Thread.run is run)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


def test_a_name_is_cut_to_the_kernel_limit_on_a_character_boundary() -> None:
    assert kernel_name("reserve-puts") == b"reserve-puts"
    assert kernel_name("link-upstream-partition-3") == b"link-upstream-p"
    assert len(kernel_name("x" * 40)) == NAME_BYTES
    # 'é' is two bytes in UTF-8: one starting at byte 14 is dropped, not cut in half.
    assert kernel_name("a" * 14 + "é") == b"a" * 14
    assert kernel_name("a" * 13 + "é") == ("a" * 13 + "é").encode()
    seen = _run(1, "a" * 14 + "éé")
    assert seen["after"] == ["a" * 14]
