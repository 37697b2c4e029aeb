"""What gRPC itself costs a Taproot server per byte: CPU of a grpc.aio
server (the roles' server) receiving, then sending, 1 MiB Session frames on
loopback, measured from /proc on the server process.

    .venv/bin/python -m taproot_ops.bench.grpc_cost [--frames 400] [--size 1048576]

The per-message figures in docs/benchmarks.md subtract this floor: a 1 KiB
message crosses each hop once in and once out.
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

from protocol import pb
from protocol import taproot_pb2_grpc as pb_grpc

OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def serve(mode: str, port: int, frames: int, size: int) -> None:
    class Servicer(pb_grpc.BrokerServicer):
        async def Session(self, requests, context):  # type: ignore[no-untyped-def]
            if mode == "receive":
                count = 0
                async for _ in requests:
                    count += 1
                yield pb.Frame(heartbeat=pb.Heartbeat(sent_time_us=count))
            else:
                frame = pb.Frame(push_columns=pb.PushColumns(queue_id=1, count=1000, arrow_ipc=os.urandom(size)))
                for _ in range(frames):
                    yield frame

    async def main() -> None:
        server = grpc.aio.server(options=OPTIONS)
        pb_grpc.add_BrokerServicer_to_server(Servicer(), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(mode: str, frames: int, size: int, port: int) -> float:
    """Server CPU microseconds per frame."""
    server = subprocess.Popen([sys.executable, "-m", "taproot_ops.bench.grpc_cost", "--serve", mode,
                               "--port", str(port), "--frames", str(frames), "--size", str(size)])
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = pb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
        frame = pb.Frame(put_columns=pb.PutColumns(queue_id=1, arrow_ipc=os.urandom(size)))

        def requests() -> Iterator[pb.Frame]:
            if mode == "receive":
                yield from (frame for _ in range(frames))
            else:
                time.sleep(60)   # keep the stream open while the server sends
                yield frame
        before = cpu_s(server.pid)
        received = 0
        for _ in stub.Session(requests()):
            received += 1
            if mode == "send" and received == frames:
                break
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
    parser.add_argument("--serve", choices=("receive", "send"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.frames, args.size)
        return
    for mode in ("receive", "send"):
        us = measure(mode, args.frames, args.size, args.port)
        print(f"grpc.aio server, {mode} {args.size:,}-byte frames: {us:,.0f} µs CPU per frame "
              f"({us / (args.size / 1024):.2f} µs per KiB)")


if __name__ == "__main__":
    main()
