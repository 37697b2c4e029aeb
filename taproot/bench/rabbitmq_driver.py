"""RabbitMQ clients for `taproot bench --compare` (aio-pika).

- priority: one durable quorum queue per Taproot queue; persistent messages.
- fanout: a fanout exchange bound to one quorum queue per app.
- broadcast: a fanout exchange; each consumer binds its own exclusive,
  transient queue (like BlazingMQ broadcast: no storage, only who is there).
Publisher confirms (up to `batch` in flight per producer), manual consumer
acks, prefetch equal to Taproot's consumer window.
"""

from __future__ import annotations

import asyncio

import aio_pika

from taproot.bench import aio
from taproot.bench.runner import Shared, merge_consumers, merge_producers
from taproot.bench.scenarios import Scenario
from taproot.bench.taproot_driver import CONSUMER_WINDOW

QUORUM: dict = {"x-queue-type": "quorum"}


def _url(address: str) -> str:
    return f"amqp://guest:guest@{address}/"


def _names(scenario: Scenario, queue: int) -> tuple[str, list[str]]:
    """(exchange, queues); the exchange is "" (default) in priority mode."""
    base = f"bench-{scenario.name}-q{queue}"
    if scenario.mode == "priority":
        return "", [base]
    if scenario.mode == "fanout":
        return base, [f"{base}-app{j}" for j in range(scenario.consumers)]
    return base, []


def prepare(address: str, scenario: Scenario) -> None:
    async def go() -> None:
        connection = await aio_pika.connect(_url(address))
        async with connection:
            channel = await connection.channel()
            for q in range(scenario.queues):
                exchange, queues = _names(scenario, q)
                for name in queues:
                    await channel.queue_delete(name)
                    queue = await channel.declare_queue(name, durable=True, arguments=QUORUM)
                    if exchange:
                        ex = await channel.declare_exchange(exchange, aio_pika.ExchangeType.FANOUT, durable=True)
                        await queue.bind(ex)
                if exchange and not queues:
                    await channel.declare_exchange(exchange, aio_pika.ExchangeType.FANOUT, durable=True)
    asyncio.run(go())


def run_producers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    persistent = aio_pika.DeliveryMode.PERSISTENT if scenario.mode != "broadcast" else aio_pika.DeliveryMode.NOT_PERSISTENT

    async def producer(q: int) -> tuple[int, dict]:
        exchange_name, queues = _names(scenario, q)
        routing_key = queues[0] if scenario.mode == "priority" else ""
        connection = await aio_pika.connect(_url(address))
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = (channel.default_exchange if not exchange_name
                        else await channel.get_exchange(exchange_name))

            async def publish(payload: bytes):
                return asyncio.ensure_future(exchange.publish(
                    aio_pika.Message(payload, delivery_mode=persistent), routing_key=routing_key))
            return q, await aio.produce(scenario, shared, publish)

    async def main() -> list:
        return await asyncio.gather(*(producer(q) for q, _ in clients))
    return merge_producers(asyncio.run(main()))


def run_consumers(address: str, scenario: Scenario, clients: list[tuple[int, int]], shared: Shared) -> dict:
    async def consumer(q: int, n: int) -> aio.Recorder:
        recorder = aio.Recorder(scenario, shared, q)
        exchange_name, queues = _names(scenario, q)
        connection = await aio_pika.connect(_url(address))
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=CONSUMER_WINDOW)
            if scenario.mode == "broadcast":
                queue = await channel.declare_queue(exclusive=True, auto_delete=True)
                await queue.bind(await channel.get_exchange(exchange_name))
            else:
                queue = await channel.get_queue(queues[n] if scenario.mode == "fanout" else queues[0])

            async def on_message(message) -> None:
                recorder.received(message.body)
                await message.ack()
            await queue.consume(on_message)
            aio.mark_ready(shared)
            await recorder.until_done()
        return recorder

    async def main() -> list:
        return await asyncio.gather(*(consumer(q, n) for q, n in clients))
    return merge_consumers([r.pushes for r in asyncio.run(main())])
