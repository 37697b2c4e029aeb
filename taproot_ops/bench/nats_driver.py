"""NATS clients for `taproot bench --compare` (nats-py).

- priority: one JetStream stream per Taproot queue (file storage, work-queue
  retention) and one durable pull consumer; explicit acks.
- fanout: one stream (file storage) with one durable pull consumer per app,
  each receiving every message.
- broadcast: core NATS subjects (no storage, only who is subscribed). Core
  publishes have no acknowledgement; the bench counts a message as ACKed when
  a PING after it is answered (`flush()`), that is, when the server has
  processed it.
Async publishes with up to `window` PubAcks outstanding per producer; consumers
fetch up to Taproot's consumer window at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from taproot_ops.bench import aio
from taproot_ops.bench.runner import Shared, merge_consumers, merge_producers
from taproot_ops.bench.scenarios import Scenario
from taproot_ops.bench.taproot_driver import CONSUMER_WINDOW

FETCH = 1000
FLUSH_EVERY = 100  # broadcast: publishes per PING (their 'ACK')


def _stream(scenario: Scenario, q: int) -> tuple[str, str]:
    name = f"bench-{scenario.name}-q{q}".replace("-", "_").upper()
    return name, f"bench.{scenario.name}.q{q}"


def prepare(address: str, scenario: Scenario) -> None:
    if scenario.mode == "broadcast":
        return

    async def go() -> None:
        nc = await nats.connect(f"nats://{address}")
        js = nc.jetstream()
        for q in range(scenario.queues):
            name, subject = _stream(scenario, q)
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass
            retention = RetentionPolicy.WORK_QUEUE if scenario.mode == "priority" else RetentionPolicy.LIMITS
            await js.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE,
                                             retention=retention))
            for j in range(scenario.consumers if scenario.mode == "fanout" else 1):
                await js.add_consumer(name, ConsumerConfig(durable_name=f"app{j}", ack_policy=AckPolicy.EXPLICIT,
                                                           max_ack_pending=CONSUMER_WINDOW))
        await nc.close()
    asyncio.run(go())


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    async def producer(q: int) -> tuple[int, dict[str, Any]]:
        nc = await nats.connect(f"nats://{address}")
        _, subject = _stream(scenario, q)
        try:
            if scenario.mode == "broadcast":
                subject = f"bcast.{scenario.name}.q{q}"
                unflushed: list[asyncio.Future[None]] = []

                async def publish(payload: bytes) -> asyncio.Future[None]:
                    await nc.publish(subject, payload)
                    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    unflushed.append(done)
                    if len(unflushed) >= FLUSH_EVERY:
                        asyncio.ensure_future(_flush(nc, _take(unflushed)))
                    return done

                async def flusher() -> None:  # the last partial group, and a slow trickle
                    while True:
                        await asyncio.sleep(0.005)
                        if unflushed:
                            asyncio.ensure_future(_flush(nc, _take(unflushed)))

                ticker = asyncio.ensure_future(flusher())
                try:
                    result = await aio.produce(scenario, shared, publish)
                finally:
                    ticker.cancel()
            else:
                js = nc.jetstream(publish_async_max_pending=scenario.window)

                async def publish(payload: bytes) -> Any:  # type: ignore[misc]  # redefined per branch
                    return await js.publish_async(subject, payload)
                result = await aio.produce(scenario, shared, publish)
        finally:
            await nc.close()
        return q, result

    async def main() -> list[tuple[int, dict[str, Any]]]:
        return list(await asyncio.gather(*(producer(q) for q, _ in clients)))
    return merge_producers(asyncio.run(main()))


async def _flush(nc: Any, waiting: list[Any]) -> None:
    try:
        await nc.flush(timeout=60)
        for f in waiting:
            f.set_result(None)
    except Exception as exc:  # noqa: BLE001 - each waiting publish counts as failed
        for f in waiting:
            f.set_exception(exc)


def _take(items: list[Any]) -> list[Any]:
    out = list(items)
    items.clear()
    return out


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict[str, Any]:
    async def consumer(q: int, n: int) -> aio.Recorder:
        recorder = aio.Recorder(scenario, shared, q)
        nc = await nats.connect(f"nats://{address}")
        try:
            if scenario.mode == "broadcast":
                async def on_message(msg: Any) -> None:
                    recorder.received(msg.data)
                await nc.subscribe(f"bcast.{scenario.name}.q{q}", cb=on_message, pending_msgs_limit=1_000_000)
                await nc.flush()
                aio.mark_ready(shared)
                await recorder.until_done()
            else:
                name, subject = _stream(scenario, q)
                js = nc.jetstream()
                sub = await js.pull_subscribe_bind(f"app{n if scenario.mode == 'fanout' else 0}", stream=name)
                aio.mark_ready(shared)
                done = asyncio.ensure_future(recorder.until_done())
                while not done.done():
                    try:
                        messages = await sub.fetch(FETCH, timeout=0.5)
                    except (nats.errors.TimeoutError, asyncio.TimeoutError):
                        continue
                    for msg in messages:
                        recorder.received(msg.data)
                        await msg.ack()
        finally:
            await nc.close()
        return recorder

    async def main() -> list[Any]:
        return await asyncio.gather(*(consumer(q, n) for q, n in clients))
    return merge_consumers([r.pushes for r in asyncio.run(main())])
