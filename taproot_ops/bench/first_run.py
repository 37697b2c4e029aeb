"""How long a newcomer waits: `make run` in a pseudo-terminal, as a person
runs it, timed from the start to each thing the screen shows (set-up done,
"serving", the first delivery, every role up), then Ctrl-C.

    python -m taproot_ops.bench.first_run                  # in this checkout
    python -m taproot_ops.bench.first_run --clean-clone    # in a fresh `git clone` of it (set-up included)
    python -m taproot_ops.bench.first_run --clean-clone --runs 2   # and a second run there

Needs pexpect (the test extra) and the shipped configuration's ports free.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MILESTONES = (
    ("set-up: Python packages", r"from PyPI: (done|failed)"),
    ("set-up: Delta's jars", r"delta-spark's jars: (done|failed)"),
    ("serving", r"== serving on \S+; from"),
    ("first message delivered", r"the first message was delivered"),
    ("Spark ready", r"Spark starting and warming up: (done|failed)"),
    ("the demo decided by the pipeline", r"the pipeline wrote"),
    ("every role up", r"Ctrl-C stops the cluster"),
)


def timed_run(checkout: Path, timeout_s: float = 1800) -> tuple[list[tuple[str, float]], int | None]:
    """(milestone, seconds from the start) in the order seen, and make's exit status after Ctrl-C."""
    import pexpect

    started = time.monotonic()
    child = pexpect.spawn("make", ["run"], cwd=str(checkout), encoding="utf-8", codec_errors="replace",
                          dimensions=(50, 200), timeout=timeout_s)
    seen: list[tuple[str, float]] = []
    patterns = [pattern for _, pattern in MILESTONES]
    try:
        while not seen or seen[-1][0] != MILESTONES[-1][0]:
            index = child.expect(patterns)
            seen.append((MILESTONES[index][0], time.monotonic() - started))
            print(f"  {seen[-1][1]:7.1f} s  {seen[-1][0]}", flush=True)
        child.sendintr()
        child.expect(pexpect.EOF, timeout=120)
    except (pexpect.EOF, pexpect.TIMEOUT) as exc:
        print(f"make run ended early ({type(exc).__name__}); its last output:\n{child.before[-3000:]}",
              file=sys.stderr)
    finally:
        child.close(force=True)
    return seen, child.exitstatus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clean-clone", action="store_true", help="run in a fresh clone of this checkout")
    parser.add_argument("--runs", type=int, default=1, help="make run this many times (default 1)")
    args = parser.parse_args(argv)
    try:
        import pexpect  # noqa: F401
    except ModuleNotFoundError:
        print("needs pexpect: pip install 'pexpect>=4.9' (the test extra has it)", file=sys.stderr)
        return 2
    checkout = Path(__file__).resolve().parents[2]
    if args.clean_clone:
        clone = Path(tempfile.mkdtemp(prefix="taproot-first-run-")) / "taproot"
        print(f"cloning {checkout} into {clone}", flush=True)
        subprocess.run(["git", "clone", "-q", str(checkout), str(clone)], check=True)
        checkout = clone
    status = 0
    for run in range(1, args.runs + 1):
        print(f"make run #{run} in {checkout}:", flush=True)
        seen, code = timed_run(checkout)
        print(f"  Ctrl-C: make exited with {code}", flush=True)
        if code != 0 or len(seen) < 3:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
