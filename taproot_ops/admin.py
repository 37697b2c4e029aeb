"""`taproot admin`: the admin API of a running cluster (`protocol.admin`),
asked of every node (and, for `status`, every proxy) of the configuration,
or of the hosts given; the answers are put together. `--json` prints them
as JSON. Refusals print their stable code and why, and exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Mapping

import conf
from protocol import pb
from protocol.auth import metadata as auth_metadata
from protocol.codes import ResultCode
from protocol.tls import ClientTls
from protocol.tls import channel as tls_channel

TIMEOUT_S = 30.0


@dataclass
class Answer:
    host: str
    code: ResultCode
    message: str = ""
    data: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.code == ResultCode.SUCCESS


def call(host: str, command: str, fields: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S,
         tls: ClientTls | None = None, token: str | None = None) -> Answer:
    """One admin command on one node or proxy (`fields`: domain, uri, app),
    over TLS with `tls`, presenting `token` ([auth])."""
    import grpc

    from protocol import pb_grpc
    try:
        request = pb.AdminRequest(command=command, **(fields or {}))
        with tls_channel(host, tls) as channel:
            reply = pb_grpc.AdminStub(channel).Command(request, timeout=timeout_s, metadata=auth_metadata(token))
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Answer(host, ResultCode.TIMEOUT, f"no answer within {timeout_s:.0f} s")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return Answer(host, ResultCode.NOT_SUPPORTED, "this server has no admin API (an older release?)")
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return Answer(host, ResultCode.NOT_CONNECTED, f"unreachable: {details}")
    code = ResultCode(reply.code)
    if code != ResultCode.SUCCESS:
        return Answer(host, code, reply.message)
    return Answer(host, code, data=json.loads(reply.json))


# -- the commands ----------------------------------------------------------------------------------

def _targets(args: argparse.Namespace, with_proxies: bool = False) -> list[tuple[str, str]]:
    """(name, host:port) of the roles to ask."""
    if args.hosts:
        return [(host, host) for host in args.hosts]
    config = _config(args)
    roles = [(n.name, n.address) for n in config.nodes]
    if with_proxies:
        roles += [(p.name, p.address) for p in config.proxies]
    return roles


def _config(args: argparse.Namespace) -> conf.ClusterConfig:
    return conf.load(args.config, data_dir=args.data_dir)


def _access(args: argparse.Namespace) -> dict[str, Any]:
    """`call`'s tls and token, as the cluster's config says (`conf.client_access`)."""
    return conf.client_access(_config(args))


def _fail(answer: Answer, name: str) -> str:
    return f"{name} ({answer.host}): {answer.code.name}: {answer.message}"


def status(args: argparse.Namespace) -> int:
    access = _access(args)
    answers = [(name, call(host, "status", **access)) for name, host in _targets(args, with_proxies=True)]
    if args.json:
        _print_json(_by_name(answers))
        return 0 if all(a.ok for _, a in answers) else 1
    nodes = [(name, a) for name, a in answers if a.ok and a.data and a.data.get("role") == "node"]
    print(f"cluster {nodes[0][1].data['cluster'] if nodes and nodes[0][1].data else '?'}")
    for name, a in answers:
        if not a.ok or a.data is None:
            print(f"  {name:<10} {a.host:<21} {a.code.name}: {a.message}")
        elif a.data["role"] == "node":
            led = [str(p["partition"]) for p in a.data["partitions"] if p["here"]]
            print(f"  {name:<10} {a.host:<21} node, up {a.data['uptime_s']:.0f} s, leads partition(s) "
                  f"{', '.join(led) or 'none'}, domains version {a.data['domains_version']}")
        else:
            buffer = a.data["retransmission_buffer"]
            print(f"  {name:<10} {a.host:<21} proxy, up {a.data['uptime_s']:.0f} s, "
                  f"{'connected to ' + a.data['upstream'] if a.data['connected'] else 'NOT connected'}, "
                  f"{a.data['sessions']} session(s), {buffer['messages']} PUT(s) awaiting ACK, "
                  f"{a.data['failovers']} failover(s)")
    partitions = _partitions([a.data for _, a in nodes if a.data])
    if partitions:
        print(f"  {'partition':<10} {'leader':<10} {'epoch':>6} {'queues':>7} {'authority lag':>14}")
        for p in partitions:
            lag = f"{p['authority_lag_s']:.1f} s" if "authority_lag_s" in p else "-"
            print(f"  {p['partition']:<10} {p['leader'] or '(none)':<10} {p['epoch']:>6} {p.get('queues', '-'):>7} "
                  f"{lag:>14}")
    versions = {a.data["domains_version"] for _, a in nodes if a.data}
    if len(versions) > 1:
        print(f"  WARNING: the nodes run different domain configurations ({', '.join(sorted(versions))}): "
              "see `taproot admin domains`")
    return 0 if all(a.ok for _, a in answers) else 1


def _partitions(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per partition: the leader's own if it answered, else the
    newest lease any node has seen."""
    best: dict[int, dict[str, Any]] = {}
    for reply in replies:
        for p in reply["partitions"]:
            known = best.get(p["partition"])
            if known is None or p["here"] or (not known.get("here") and p["epoch"] > known["epoch"]):
                best[p["partition"]] = p
    return [best[p] for p in sorted(best)]


def domains(args: argparse.Namespace) -> int:
    access = _access(args)
    answers = [(name, call(host, "domains", **access)) for name, host in _targets(args)]
    if args.json:
        _print_json(_by_name(answers))
        return 0 if all(a.ok for _, a in answers) else 1
    good = [(name, a) for name, a in answers if a.ok and a.data]
    for name, a in answers:
        if not a.ok:
            print(_fail(a, name))
    versions = {a.data["version"] for _, a in good if a.data}
    for name, a in good:
        assert a.data is not None
        print(f"{name}: domains version {a.data['version']}")
    if len(versions) > 1:
        print("WARNING: the nodes differ; a node reloads its domain files when they change "
              "(docs/queue-modes.md), so a node that has not may not see the same files")
    if good:
        data = good[0][1].data or {}
        print(f"  {'domain':<16} {'mode':<10} {'delivery':<9} {'apps':<20} {'max payload':>12} {'ttl ms':>8} "
              f"{'attempts':>8}")
        for name, d in data["domains"].items():
            print(f"  {name:<16} {d['mode']:<10} {d['delivery']:<9} {','.join(d['app_ids']) or '-':<20} "
                  f"{d['max_payload_bytes']:>12} {d['message_ttl_ms']:>8} {d['max_delivery_attempts']:>8}")
    return 0 if all(a.ok for _, a in answers) else 1


def queues(args: argparse.Namespace) -> int:
    fields = {"domain": args.domain} if args.domain else {}
    access = _access(args)
    answers = [(name, call(host, "queues", fields, **access)) for name, host in _targets(args)]
    failed = [(name, a) for name, a in answers if not a.ok]
    rows = sorted((q for _, a in answers if a.ok and a.data for q in a.data["queues"]),
                  key=lambda q: (q["domain"], q["queue"]))
    if args.json:
        _print_json({"queues": rows, "errors": {name: f"{a.code.name}: {a.message}" for name, a in failed}})
        return 1 if failed else 0
    for name, a in failed:
        print(_fail(a, name), file=sys.stderr)
    if not rows:
        print("no queues" + (f" in domain {args.domain}" if args.domain else ""))
        return 1 if failed else 0
    print(f"{'queue':<40} {'p':>2} {'mode':<9} {'cons':>4} {'prod':>4} {'app':<12} {'depth':>8} {'unconf':>7} "
          f"{'puts/s':>8} {'push/s':>8} {'conf/s':>8}")
    for q in rows:
        for i, app in enumerate(q["apps"] or [None]):
            head = (f"{q['uri']:<40} {q['partition']:>2} {q['mode']:<9} {q['consumers']:>4} {q['producers']:>4}"
                    if i == 0 else " " * 63)
            puts = f"{q['puts_per_s']:>8.1f}" if i == 0 else " " * 8
            if app is None:
                print(f"{head} {'-':<12} {0:>8} {0:>7} {puts} {0.0:>8.1f} {0.0:>8.1f}")
            else:
                print(f"{head} {app['app'] or '-':<12} {app['depth']:>8} {app['unconfirmed']:>7} {puts} "
                      f"{app['pushes_per_s']:>8.1f} {app['confirms_per_s']:>8.1f}")
    return 1 if failed else 0


def _on_leader(args: argparse.Namespace, command: str,
               fields: Mapping[str, str]) -> tuple[str, dict[str, Any]] | None:
    """Ask the nodes in turn until the one leading the queue's partition
    answers (the others say NOT_READY: led elsewhere): its name and answer.
    Prints the refusal and returns None if none does."""
    last: tuple[str, Answer] | None = None
    access = _access(args)
    for name, host in _targets(args):
        answer = call(host, command, fields, **access)
        if answer.ok:
            return name, answer.data or {}
        if answer.code != ResultCode.NOT_READY or last is None or last[1].code == ResultCode.NOT_CONNECTED:
            last = (name, answer)
        if answer.code not in (ResultCode.NOT_READY, ResultCode.NOT_CONNECTED):
            break
    if last is not None:
        print(_fail(last[1], last[0]), file=sys.stderr)
    return None


def queue(args: argparse.Namespace) -> int:
    found = _on_leader(args, "queue", {"uri": args.uri})
    if found is None:
        return 1
    name, data = found
    if args.json:
        _print_json(data)
        return 0
    print(f"{data['uri']} on {name}: partition {data['partition']}, {data['mode']}, "
          f"{data['consumers']} consumer(s), {data['producers']} producer(s)")
    for app in data["apps"]:
        print(f"  app {app['app'] or '-'}: {app['waiting']} waiting, {app['unconfirmed']} unconfirmed")
        oldest = app["oldest_waiting"]
        if oldest:
            age = f"{oldest['age_s']:.1f} s" if oldest["age_s"] is not None else "age unknown"
            print(f"    oldest waiting: seq {oldest['seq']}, guid {oldest['guid']}, {age}, "
                  f"pushed {oldest['delivery_count']} time(s) before")
        for c in app["consumers"]:
            subscription = " OR ".join(c["subscriptions"]) or "everything"
            print(f"    consumer {c['peer']} #{c['queue_id']}: priority {c['priority']}, {subscription}, "
                  f"{c['unconfirmed_messages']}/{c['max_unconfirmed_messages']} unconfirmed"
                  + (" (paused)" if c["paused"] else ""))
    return 0


def purge(args: argparse.Namespace) -> int:
    what = f"{args.uri}" + (f" (app {args.app})" if args.app else " (every app)")
    if not args.yes:
        print(f"purge drops every message of {what} that waits or was pushed and not confirmed, for good. "
              "Add --yes to do it.", file=sys.stderr)
        return 2
    found = _on_leader(args, "purge", {"uri": args.uri, "app": args.app or ""})
    if found is None:
        return 1
    name, data = found
    if args.json:
        _print_json(data)
    else:
        apps = ", ".join(f"{n} of app {a or '-'}" for a, n in data["purged"].items()) or "nothing"
        print(f"{data['uri']} on {name}: purged {apps} ({data['total']} messages, recorded in the confirm log)")
    return 0


def stop(args: argparse.Namespace) -> int:
    host = args.target
    if ":" not in host:
        config = _config(args)
        roles = {n.name: n.address for n in config.nodes} | {p.name: p.address for p in config.proxies}
        if host not in roles:
            print(f"stop: no node or proxy named {host!r} (known: {', '.join(sorted(roles))}); "
                  "or give its host:port", file=sys.stderr)
            return 2
        host = roles[host]
    answer = call(host, "stop", **_access(args))
    if not answer.ok:
        print(_fail(answer, args.target), file=sys.stderr)
        return 1
    if args.json:
        _print_json(answer.data)
    else:
        what = ("StopRequest to its clients, then it goes; they move to their next host"
                if (answer.data or {}).get("role") == "proxy"
                else "StopRequest to its peers, drained, then its partitions handed over")
        print(f"{args.target}: stopping ({what})")
    return 0


def _by_name(answers: list[tuple[str, Answer]]) -> dict[str, Any]:
    """Each role's answer, or its refusal, by its name (`--json`)."""
    return {name: a.data if a.ok else {"error": a.code.name, "message": a.message} for name, a in answers}


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("admin", help="ask the running cluster: status, domains, queues, queue, purge, stop")
    p.add_argument("--config", help="cluster.toml: its nodes (and proxies) are asked, with its [tls] "
                                    "(default: the shipped one)")
    p.add_argument("--data-dir", help="override cluster.data_dir (where [tls] auto keeps the CA)")
    p.add_argument("--host", dest="hosts", action="append", metavar="HOST:PORT",
                   help="ask this node or proxy instead (repeat for more)")
    p.add_argument("--json", action="store_true", help="print the answers as JSON")
    commands = p.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")
    c = commands.add_parser("status", help="nodes, proxies, partitions: who leads each, epochs, pipeline lag")
    c.set_defaults(func=status)
    c = commands.add_parser("domains", help="the live domain configuration of each node and its version")
    c.set_defaults(func=domains)
    c = commands.add_parser("queues", help="queues with depth, unconfirmed, consumers, producers, rates per app")
    c.add_argument("--domain", help="only this domain")
    c.set_defaults(func=queues)
    c = commands.add_parser("queue", help="one queue: its consumers, their priority and subscription, "
                                          "unconfirmed, the oldest waiting message")
    c.add_argument("uri")
    c.set_defaults(func=queue)
    c = commands.add_parser("purge", help="drop a queue's waiting and unconfirmed messages (or one app's), "
                                          "recorded so a restart does not bring them back")
    c.add_argument("uri")
    c.add_argument("--app", help="only this app of a fanout queue")
    c.add_argument("--yes", action="store_true", help="really purge")
    c.set_defaults(func=purge)
    c = commands.add_parser("stop", help="stop a node or proxy gracefully (drain, then hand over)")
    c.add_argument("target", help="a node or proxy name of the config, or host:port")
    c.set_defaults(func=stop)

