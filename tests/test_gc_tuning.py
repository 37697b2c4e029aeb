"""The garbage collector of a serving process (`protocol.gc_tuning`), in a
process of its own: the settings are the whole interpreter's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, json, weakref
    from protocol import gc_tuning

    class Node:
        def __init__(self):
            self.other = None

    startup = [Node() for _ in range(1000)]
    watch = gc_tuning.settle_for_serving()
    frozen = gc.get_freeze_count()

    # Reference cycles made while serving are still collected, by the young
    # collections the new threshold runs.
    first = Node(); first.other = Node(); first.other.other = first
    gone = weakref.ref(first)
    del first
    for _ in range(3 * gc_tuning.YOUNG_THRESHOLD):
        a = Node(); a.other = Node(); a.other.other = a
    del a
    print(json.dumps({"threshold": gc.get_threshold(), "frozen": frozen, "cycle_collected": gone() is None,
                      "counts": watch.counts, "seconds": watch.seconds, "describe": watch.describe()}))
""")


def test_a_serving_process_freezes_its_startup_objects_and_still_collects_cycles():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    import json
    got = json.loads(out.stdout)
    assert got["threshold"] == [10_000, 10, 100]
    assert got["frozen"] >= 1000                      # the startup objects, never scanned again
    assert got["cycle_collected"] is True
    assert got["counts"][0] >= 2 and all(s >= 0 for s in got["seconds"])
    assert got["describe"].startswith("generation 0: ") and "longest" in got["describe"]


SDK_SCRIPT = textwrap.dedent("""
    import gc, json
    import taproot
    from taproot.session import Session   # the SDK loaded: it leaves the collector alone
    before = gc.get_threshold()
    watch = taproot.tune_gc()
    print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                      "exported": "tune_gc" in taproot.__all__, "watch": type(watch).__name__}))
""")


def test_the_sdk_tunes_the_collector_only_when_asked():
    out = subprocess.run([sys.executable, "-c", SDK_SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    import json
    got = json.loads(out.stdout)
    assert got["before"] == [700, 10, 10]            # importing the SDK and its session changed nothing
    assert got["after"] == [10_000, 10, 100] and got["frozen"] > 1000
    assert got["exported"] and got["watch"] == "GcWatch"
