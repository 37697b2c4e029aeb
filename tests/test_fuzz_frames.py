"""Fuzz tier, the wire: scripts of random, plausible-but-wrong and mutated
frames (`fuzzing.py`) sent to a live node and a live proxy, each on a
stream of its own over raw gRPC. For every script:
- the stream ends, once the client half-closes, within seconds (no hang),
  with OK or INVALID_ARGUMENT (bytes that are no Frame);
- no answer carries UNKNOWN (a handler that failed on the input);
and after all of them both roles are alive, their logs show no handler
failure and no traceback, and a well-behaved client is served through the
proxy and directly.

`SCRIPTS` per role by default (seeded: the same inputs each run); `pytest
--long` sends 50 times as many from a fresh seed, printed for a rerun
(`TAPROOT_FUZZ_SEED`).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import grpc
import pytest
from conftest import collect
from fuzzing import script

from protocol import pb

pytestmark = [pytest.mark.integration]

SCRIPTS = 300
STREAM_DEADLINE_S = 20.0
OK_STATUSES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}


@pytest.fixture(scope="module")
def roles(tmp_path_factory):
    """A node and a proxy of their own (no pipeline: the express lane
    pushes), on a copy of the test cluster's configuration."""
    from taproot_ops.embedded import EmbeddedCluster
    conf_dir = tmp_path_factory.mktemp("conf")
    shutil.copytree(Path(__file__).resolve().parent / "cluster_conf", conf_dir, dirs_exist_ok=True)
    with EmbeddedCluster(str(conf_dir / "cluster.toml"), data_dir=str(tmp_path_factory.mktemp("data")),
                         ephemeral_ports=True, with_pipeline=False) as cluster:
        yield cluster


def statuses(message) -> list[int]:
    """Every Status and ack code anywhere in an answer."""
    found = []
    for field, value in message.ListFields():
        if field.message_type is pb.Status.DESCRIPTOR:
            found.append(value.code)
        elif field.name == "code" and field.enum_type is not None:
            found.append(value)
        elif field.message_type is not None:
            for item in (value if field.is_repeated else [value]):
                found += statuses(item)
    return found


def send(channel: grpc.Channel, frames: list[bytes]) -> tuple[grpc.StatusCode, list[pb.Frame], str]:
    session = channel.stream_stream("/taproot.v1.Broker/Session", request_serializer=lambda b: b,
                                    response_deserializer=pb.Frame.FromString)
    call = session(iter(frames), timeout=STREAM_DEADLINE_S)
    answers: list[pb.Frame] = []
    try:
        for answer in call:
            answers.append(answer)
    except grpc.RpcError:
        pass
    return call.code(), answers, call.details() or ""


def seed_and_count(config) -> tuple[int, int]:
    if config.getoption("--long"):
        seed = int(os.environ.get("TAPROOT_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
        return seed, SCRIPTS * 50
    return int(os.environ.get("TAPROOT_FUZZ_SEED", "20261123")), SCRIPTS


def well_behaved_client_is_served(address: str, queue: str) -> None:
    from taproot import Session
    with Session([address]) as session:
        producer = session.open_queue(queue, write=True)
        for future in [producer.post(b"after fuzz %d" % i) for i in range(50)]:
            future.result(timeout=30)
        consumer = session.open_queue(queue, read=True)
        assert len(collect(consumer, 50, timeout_s=30)) == 50


@pytest.mark.parametrize("role", ["node", "proxy"])
def test_fuzzed_frames_get_coded_answers_and_the_role_keeps_serving(roles, role, request):
    address = roles.node_address if role == "node" else roles.proxy_address
    process = roles.processes[roles.config.nodes[0].name if role == "node" else roles.proxy_names[0]]
    seed, count = seed_and_count(request.config)
    print(f"\nfuzzing the {role} at {address}: {count} scripts, TAPROOT_FUZZ_SEED={seed}")
    rng = random.Random(f"{seed}-{role}")
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20),
                                                      ("grpc.max_receive_message_length", 64 << 20)])
    problems: list[str] = []
    codes: dict[str, int] = {}
    started = time.monotonic()
    try:
        for i in range(count):
            frames = script(rng)
            code, answers, details = send(channel, frames)
            codes[code.name] = codes.get(code.name, 0) + 1
            if code not in OK_STATUSES:
                problems.append(f"script {i}: stream ended {code.name}: {details}")
            unknown = [a for a in answers if pb.UNKNOWN in statuses(a)]
            if unknown:
                problems.append(f"script {i}: answered UNKNOWN: {unknown[0]}")
            if process.popen.poll() is not None:
                problems.append(f"script {i}: the {role} exited with {process.popen.returncode}")
                break
            if len(problems) >= 5:
                break
    finally:
        channel.close()
    print(f"{role}: {count} scripts in {time.monotonic() - started:.1f} s; stream endings {codes}")
    assert not problems, "\n".join(problems)
    log = process.log_file.read_text(errors="replace")
    for marker in ("Traceback", "handler failed", "panicked"):
        assert marker not in log, f"the {role}'s log shows {marker!r}:\n" + \
            log[max(0, log.index(marker) - 2000):log.index(marker) + 3000]
    assert process.popen.poll() is None
    well_behaved_client_is_served(address, f"taproot://demo/after-fuzz-{role}")
