"""What gRPC itself costs a Taproot server per byte and per message: CPU of
a grpc.aio server (the roles' server) receiving, then sending, Session frames
on loopback, measured from /proc on the server process.

    .venv/bin/python -m taproot_ops.bench.grpc_cost [--frames 400] [--size 1048576] [--bundle K]

The per-message figures in docs/benchmarks.md subtract this floor: a 1 KiB
message crosses each hop once in and once out. `--bundle K` sends the frames
K to a gRPC message (`protocol.bundles`), as a stream does when K frames are
queued for its peer at once; `--bundle 1 8` compares.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Iterator

import grpc

from protocol import bundles, pb
from protocol import taproot_pb2_grpc as pb_grpc
from protocol.stream import add_broker, session_stream

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def messages(frame: bytes, frames: int, bundle: int) -> Iterator[bytes]:
    """`frames` copies of `frame`, `bundle` to a message."""
    for first in range(0, frames, bundle):
        count = min(bundle, frames - first)
        yield frame if count == 1 else bundles.encode([frame] * count)


def serve(mode: str, port: int, frames: int, size: int, bundle: int) -> None:
    class Servicer(pb_grpc.BrokerServicer):
        async def Session(self, requests, context):  # type: ignore[no-untyped-def]
            if mode == "receive":
                count = 0
                async for message in requests:
                    count += len(bundles.unbundled(message))
                yield pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=count)).SerializeToString()
            else:
                frame = pb.Frame(push_columns=pb.PushColumns(queue_id=1, count=1000, arrow_ipc=os.urandom(size)))
                for message in messages(frame.SerializeToString(), frames, bundle):
                    yield message

    async def main() -> None:
        server = grpc.aio.server(options=OPTIONS)
        add_broker(Servicer(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, frames: int, size: int, port: int, bundle: int = 1) -> float:
    """Server CPU microseconds per frame."""
    server = subprocess.Popen([sys.executable, "-m", "taproot_ops.bench.grpc_cost", "--serve", mode,
                               "--port", str(port), "--frames", str(frames), "--size", str(size),
                               "--bundle", str(bundle)])
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        session = session_stream(channel)
        frame = pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=os.urandom(size))).SerializeToString()

        def requests() -> Iterator[bytes]:
            if mode == "receive":
                yield from messages(frame, frames, bundle)
            else:
                time.sleep(60)   # keep the stream open while the server sends
                yield frame
        before = cpu_s(server.pid)
        received = 0
        for message in session(requests()):
            received += len(bundles.unbundled(message))
            if mode == "send" and received == frames:
                break
        if mode == "receive":
            assert received == 1 and message.heartbeat.sent_time_us == frames, "the server missed frames"
        used = cpu_s(server.pid) - before
        channel.close()
        return used / frames * 1e6
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--port", type=int, default=50777)
    parser.add_argument("--bundle", type=int, nargs="+", default=[1], metavar="K",
                        help="frames a gRPC message (several: one measurement each)")
    parser.add_argument("--serve", choices=("receive", "send"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.frames, args.size, args.bundle[0])
        return
    if any(k < 1 for k in args.bundle):
        parser.error("--bundle takes 1 or more frames a message")
    for bundle in args.bundle:
        for mode in ("receive", "send"):
            us = measure(mode, args.frames, args.size, args.port, bundle)
            print(f"grpc.aio server, {mode} {args.size:,}-byte frames, {bundle} a message: {us:,.0f} µs CPU "
                  f"per frame ({us / (args.size / 1024):.2f} µs per KiB)", flush=True)


if __name__ == "__main__":
    main()
