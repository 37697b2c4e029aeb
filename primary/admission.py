"""Admission: whether a node takes an open, a configure or a PUT, decided
before anything is accepted.

Pure: bad input becomes a `Refusal` (a stable code and a sentence for the
client), never an exception, and nothing here has state, threads or I/O.
`primary.node` asks these questions and sends the answers; quotas, which keep
state, are asked separately (`primary.quota`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from primary.dispatcher import ConsumerOptions, NotFrom
from protocol import ResultCode, pb
from protocol.codes import COMPRESSION_NAMES
from protocol.expression import ExpressionError, compile_expression
from protocol.limits import CONSUMER_PRIORITY_MAX, GUID_LENGTH, PUT_TIME_US_MAX
from protocol.properties import validate_wire
from protocol.uri import QueueUri, parse_queue_uri

if TYPE_CHECKING:
    from conf import ClusterConfig, DomainConfig

COMPRESSIONS = (pb.COMPRESSION_NONE, *COMPRESSION_NAMES)
PAUSED = ConsumerOptions(0, 0, 0)


@dataclass(frozen=True)
class Refusal:
    code: ResultCode
    message: str


@dataclass(frozen=True)
class Open:
    """An open that passed every check: where it goes and with what options."""
    uri: QueueUri
    domain: "DomainConfig"
    options: ConsumerOptions      # the domain's defaults filled in (read queues)


def consumer_options(options: pb.QueueOptions | None, defaults: ConsumerOptions) -> ConsumerOptions | Refusal:
    if options is None:
        return defaults
    if options.max_unconfirmed_messages < 0 or options.max_unconfirmed_bytes < 0:
        return Refusal(ResultCode.INVALID_ARGUMENT, "max_unconfirmed_messages and max_unconfirmed_bytes must be >= 0")
    if not -CONSUMER_PRIORITY_MAX <= options.consumer_priority <= CONSUMER_PRIORITY_MAX:
        return Refusal(ResultCode.INVALID_ARGUMENT, "consumer_priority must be within [-2^30, 2^30]")
    subscriptions = []
    for text in options.subscriptions:
        try:
            subscriptions.append(compile_expression(text))
        except ExpressionError as exc:
            return Refusal(ResultCode.INVALID_ARGUMENT, f"subscription {text!r}: {exc}")
    return ConsumerOptions(options.max_unconfirmed_messages, options.max_unconfirmed_bytes,
                           options.consumer_priority, tuple(subscriptions))


@dataclass(frozen=True)
class Routes:
    """Where `queue@cluster` names go (docs/federation.md): this cluster's
    own name (`queue@<it>` is the local queue) and the (domain, cluster)
    pairs its federation links carry."""
    local: str = ""
    to: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def of(cls, config: "ClusterConfig") -> "Routes":
        return cls(config.name, frozenset((d, link.cluster) for link in config.links if link.direction == "push"
                                          for d in link.domains))


def check_open(req: pb.OpenQueue, domains: "Mapping[str, DomainConfig]", routes: Routes = Routes()) -> Open | Refusal:
    """The URI, the domain, the access asked for, the app id against the
    domain's mode and apps, the route of a `queue@cluster` name, and the
    consumer options."""
    uri = parse_queue_uri(req.uri)
    if isinstance(uri, str):
        return Refusal(ResultCode.INVALID_ARGUMENT, uri)
    uri = uri.on(routes.local)
    domain = domains.get(uri.domain)
    if domain is None:
        return Refusal(ResultCode.REFUSED, f"unknown domain {uri.domain!r}")
    if not (req.read or req.write):
        return Refusal(ResultCode.INVALID_ARGUMENT, "open for read, write or both")
    if uri.cluster:
        if req.read:
            return Refusal(ResultCode.INVALID_ARGUMENT, f"{uri} lives on cluster {uri.cluster!r}: consume "
                           f"taproot://{uri.domain}/{uri.local_name} there (this is cluster {routes.local!r})")
        if domain.mode == "broadcast":
            return Refusal(ResultCode.NO_ROUTE, f"broadcast domain {uri.domain!r} is not stored, so it is not "
                           "routed to other clusters")
        if (uri.domain, uri.cluster) not in routes.to:
            return Refusal(ResultCode.NO_ROUTE, f"no route to cluster {uri.cluster!r} for domain {uri.domain!r}: "
                           f"no federation link of cluster {routes.local!r} carries it")
    if uri.app_id and domain.mode != "fanout":
        return Refusal(ResultCode.INVALID_ARGUMENT, f"?id= is only for fanout domains; {uri.domain!r} is {domain.mode}")
    if domain.mode == "fanout":
        if req.write and uri.app_id:
            return Refusal(ResultCode.INVALID_ARGUMENT, "producers open a fanout queue without ?id=")
        if req.read and not uri.app_id:
            return Refusal(ResultCode.INVALID_ARGUMENT, f"consumers of fanout domain {uri.domain!r} open "
                           f"taproot://{uri.domain}/{uri.queue}?id=<app>; apps: {', '.join(domain.app_ids)}")
        if req.read and uri.app_id not in domain.app_ids:
            return Refusal(ResultCode.REFUSED, f"unknown app id {uri.app_id!r}; domain {uri.domain!r} has "
                           f"apps {', '.join(domain.app_ids)}")
    defaults = ConsumerOptions(domain.max_unconfirmed_messages_default, domain.max_unconfirmed_bytes_default, 0)
    options = consumer_options(req.options if req.HasField("options") else None, defaults)
    if isinstance(options, Refusal):
        return options
    return Open(uri, domain, options)


def for_link(options: ConsumerOptions, cluster: str) -> ConsumerOptions:
    """A consumer opened by `cluster`'s pull link takes nothing that has been
    through that cluster (`NotFrom`); any other consumer's options as they are."""
    if not cluster:
        return options
    subscriptions = tuple(NotFrom(cluster, s) for s in options.subscriptions) or (NotFrom(cluster),)
    return dataclasses.replace(options, subscriptions=subscriptions)


def check_capacity(domain: "DomainConfig", queue: str, read: bool, write: bool, consumers: int,
                   producers: int) -> Refusal | None:
    """The domain's max_consumers / max_producers per queue."""
    for wanted, count, limit, what in ((read, consumers, domain.max_consumers, "consumers"),
                                       (write, producers, domain.max_producers, "producers")):
        if wanted and limit and count >= limit:
            return Refusal(ResultCode.REFUSED, f"queue {queue} has {count} {what}; domain {domain.name!r} "
                           f"allows at most {limit} (max_{what})")
    return None


def check_put(message: pb.PutMessage, domain: "DomainConfig") -> Refusal | None:
    """One PUT to a queue open for writing: GUID, payload size, compression,
    producer timestamp, properties."""
    if len(message.guid) != GUID_LENGTH:
        return Refusal(ResultCode.INVALID_ARGUMENT, f"GUID must be {GUID_LENGTH} bytes, got {len(message.guid)}")
    if len(message.payload) > domain.max_payload_bytes:
        return Refusal(ResultCode.INVALID_ARGUMENT, f"payload of {len(message.payload)} bytes exceeds the "
                       f"domain's max_payload_bytes {domain.max_payload_bytes}")
    if message.compression not in COMPRESSIONS:
        return Refusal(ResultCode.INVALID_ARGUMENT, f"unknown compression {message.compression}")
    if not 0 <= message.put_time_us <= PUT_TIME_US_MAX:
        return Refusal(ResultCode.INVALID_ARGUMENT, f"put_time_us {message.put_time_us} is outside "
                       f"[0, {PUT_TIME_US_MAX}] (microseconds from 1970 to 2262-04-11)")
    reason = validate_wire(message.properties)
    return Refusal(ResultCode.INVALID_ARGUMENT, reason) if reason else None
