"""The C allocator of a process that moves large frames
(`protocol.malloc_tuning`, `taproot.tune_malloc`), each case in a process of
its own: the settings are the whole process's, and glibc reads its
environment when the process starts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")

# Three 1 MiB blocks made and freed, over and over, as a relay's frame, its
# parsed copy and its re-serialized bytes are: with glibc's defaults the
# freed top of the heap (3 MiB) is over the trim threshold the first free set
# (twice the 1 MiB block), so it goes back to the kernel and every cycle
# faults most of its 768 pages in again.
CYCLES = textwrap.dedent("""
    import json, resource, sys

    def faults_a_cycle():
        def cycle():
            blocks = [b"x" * (1 << 20) for _ in range(3)]
            return len(blocks)
        for _ in range(3):
            cycle()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(50):
            cycle()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50
""")


def run(script: str, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("TAPROOT_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                "MALLOC_ARENA_MAX")}
    out = subprocess.run([sys.executable, "-c", CYCLES + textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=120, env={**environment, **env})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["stderr"] = out.stderr
    return got


def test_the_sdk_leaves_malloc_alone_until_asked_then_frames_stop_faulting():
    got = run("""
        import taproot
        from taproot.session import Session   # the SDK loaded: malloc as glibc set it
        before = faults_a_cycle()
        tuning = taproot.tune_malloc()
        again = taproot.tune_malloc()
        print(json.dumps({"before": before, "after": faults_a_cycle(), "applied": tuning.applied,
                          "same": again is tuning, "describe": tuning.describe(),
                          "exported": "tune_malloc" in taproot.__all__}))
    """)
    assert got["before"] >= 200                   # 480 of the 768 pages faulted in again each cycle, here
    assert got["after"] <= 5 and got["applied"]   # kept for the next cycle
    assert got["same"] and got["exported"]
    from protocol import malloc_tuning
    assert got["describe"] == ("malloc: blocks up to 32 MiB from the heap, up to 64 MiB of free heap kept, "
                               f"at most {malloc_tuning.ARENA_MAX} arenas")


@pytest.mark.parametrize("env,reason", [
    ({"TAPROOT_MALLOC_TUNING": "off"}, "TAPROOT_MALLOC_TUNING=off"),
    ({"TAPROOT_MALLOC_TUNING": " No "}, "TAPROOT_MALLOC_TUNING= No "),
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "the environment sets MALLOC_TRIM_THRESHOLD_"),
])
def test_an_environment_that_says_otherwise_keeps_its_malloc(env, reason):
    got = run("""
        from protocol import malloc_tuning
        tuning = malloc_tuning.tune()
        print(json.dumps({"applied": tuning.applied, "reason": tuning.reason, "describe": tuning.describe(),
                          "off": malloc_tuning.switched_off()}))
    """, **env)
    assert not got["applied"] and got["reason"] == reason
    assert got["describe"] == f"malloc left as it is: {reason}"
    assert got["off"] == ("TAPROOT_MALLOC_TUNING" in env)


def test_a_switch_value_it_does_not_know_is_named_and_malloc_tuned():
    got = run("""
        import logging
        logging.basicConfig(level=logging.WARNING)
        from protocol import malloc_tuning
        tuning = malloc_tuning.tune()
        print(json.dumps({"applied": tuning.applied, "faults": faults_a_cycle()}))
    """, TAPROOT_MALLOC_TUNING="sometimes")
    assert got["applied"] and got["faults"] <= 5
    assert "TAPROOT_MALLOC_TUNING='sometimes' is neither on nor off" in got["stderr"]
    assert "Traceback" not in got["stderr"]


# Eight threads each make and free a 1 MiB block at the same time, then
# glibc's `malloc_stats` names every arena on stderr ("Arena N:").
ARENAS = textwrap.dedent("""
    import ctypes, threading
    def arenas_after_threads(n=8):
        barrier = threading.Barrier(n)
        def work():
            barrier.wait()
            block = b"x" * (1 << 20)
            barrier.wait()
            return len(block)
        threads = [threading.Thread(target=work) for _ in range(n)]
        for t in threads: t.start()
        for t in threads: t.join()
        ctypes.CDLL("libc.so.6").malloc_stats()
""")


@pytest.mark.parametrize("env", [{}, {"TAPROOT_MALLOC_TUNING": "off"}, {"MALLOC_ARENA_MAX": "3"}])
def test_a_tuned_process_keeps_to_a_few_malloc_arenas_however_many_threads_allocate(env):
    from protocol import malloc_tuning

    got = run(ARENAS + textwrap.dedent("""
        from protocol import malloc_tuning
        tuning = malloc_tuning.tune()
        arenas_after_threads()
        print(json.dumps({"applied": tuning.applied, "arenas": tuning.arenas, "describe": tuning.describe()}))
    """), **env)
    counted = got["stderr"].count("Arena ")
    if not env:
        assert got["applied"] and got["arenas"] == malloc_tuning.ARENA_MAX
        assert counted <= malloc_tuning.ARENA_MAX
        assert got["describe"].endswith(f", at most {malloc_tuning.ARENA_MAX} arenas")
    elif "MALLOC_ARENA_MAX" in env:   # glibc's own limit, kept; the thresholds still tuned
        assert got["applied"] and got["arenas"] is None and counted <= 3
    else:                             # glibc's default: an arena a thread here, up to eight a core
        assert not got["applied"] and counted >= min(9, 8 * (os.cpu_count() or 1)) > malloc_tuning.ARENA_MAX
