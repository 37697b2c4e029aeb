"""What the protobuf runtime costs per data frame: building a Frame around a
body, asking its size, serializing and parsing it, reading its bytes field,
for bodies of 100 B to 1 MiB (the PUSH and PUT frames of 1,000 1 KiB
messages are about 1.1 MiB). No server: this process only.

    .venv/bin/python -m taproot_ops.bench.frame_cost [--repeat 300]

Each figure is the median of `--repeat` timings, with a fresh body of that
size each time, as a server gets one per frame (a body reused from cache
would hide the page faults a new megabyte costs). The roles build frames
with `protocol.frames.frame_of` and `wrapped`, and `Link.send` takes the
serialized bytes' length for its bound, because of what this prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

from protocol import frames, pb

SIZES = (100, 10_000, 100_000, 1_100_000)


def _median_us(make: Callable[[], object], run: Callable[[object], object], repeat: int) -> float:
    """The median time of `run(make())`, `make` outside the timing."""
    times = []
    for _ in range(repeat):
        arg = make()
        started = time.perf_counter()
        run(arg)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _body(size: int) -> Callable[[], Any]:
    return lambda: os.urandom(size)


def _message(size: int) -> Callable[[], Any]:
    return lambda: pb.PushColumns(queue_id=1, count=1000, arrow_ipc=os.urandom(size))


def _frame(size: int) -> Callable[[], Any]:
    return lambda: frames.frame_of("push_columns", queue_id=1, count=1000, arrow_ipc=os.urandom(size))


def _wire(size: int) -> Callable[[], Any]:
    return lambda: _frame(size)().SerializeToString()


# (what is timed, what it is given per size, the timed call)
_CASES: list[tuple[str, Callable[[int], Callable[[], Any]], Callable[[Any], object]]] = [
    ("Frame(push_columns=PushColumns(...))", _body, lambda body: pb.Frame(push_columns=pb.PushColumns(
        queue_id=1, count=1000, seq_starts=[1], seq_counts=[1000], arrow_ipc=body))),
    ("frame_of('push_columns', ...)", _body, lambda body: frames.frame_of(
        "push_columns", queue_id=1, count=1000, seq_starts=[1], seq_counts=[1000], arrow_ipc=body)),
    ("Frame(push_columns=body)", _message, lambda body: pb.Frame(push_columns=body)),
    ("wrapped('push_columns', body) (CopyFrom)", _message, lambda body: frames.wrapped("push_columns", body)),
    ("frame.ByteSize()", _frame, lambda frame: frame.ByteSize()),
    ("frame.SerializeToString()", _frame, lambda frame: frame.SerializeToString()),
    ("Frame.FromString(bytes)", _wire, pb.Frame.FromString),
    ("frame.push_columns.arrow_ipc (read)", _frame, lambda frame: frame.push_columns.arrow_ipc),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args(argv)
    from google.protobuf import __version__ as version  # type: ignore[import-untyped]
    from google.protobuf.internal import api_implementation  # type: ignore[import-untyped]

    print(f"protobuf {version}, {api_implementation.Type()} runtime; median µs of {args.repeat} each")
    print(f"{'':44s}" + "".join(f"{size:>12,} B" for size in SIZES))
    for name, make, run in _CASES:
        print(f"{name:44s}" + "".join(f"{_median_us(make(size), run, args.repeat):14.1f}" for size in SIZES),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
