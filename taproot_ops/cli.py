"""The `taproot` command.

    taproot run                     embedded cluster + demo traffic; Ctrl-C stops it
    taproot produce --uri U -n N    post N messages (through the proxy by default)
    taproot consume --uri U         print and confirm messages
    taproot bench                   PUT->ACK / PUT->PUSH latency and throughput
    taproot node | proxy | pipeline one role as a process (what `run` starts)

Server roles are imported lazily so that the SDK commands start fast.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import conf
from storage.spark import DELTA_CONNECTOR_MODE
from taproot_ops.embedded import ClusterStartError

DEFAULT_HOST = "127.0.0.1:30115"
# What `pip install taproot` (the SDK) leaves out; the server extra brings them.
SERVER_MODULES = frozenset({"deltalake", "pyspark", "delta", "pandas"})


def _config(args: argparse.Namespace) -> conf.ClusterConfig:
    """The cluster's configuration; on an object store, its settings given
    to this process's delta-rs (`conf.use_storage`)."""
    config = conf.load(args.config, data_dir=args.data_dir, state_dir=getattr(args, "state_dir", None))
    conf.use_storage(config)
    return config


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.add_argument("--data-dir", help="override cluster.data_dir")
    p.add_argument("--state-dir", help="override cluster.state_dir (this machine's logs, pid files, auto TLS and "
                                       "token files; default: the data directory when it is local)")
    p.add_argument("--ready-file", help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="what the role logs (default INFO)")


def _http_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between -1 and 65535, got {value}")
    return value


def _http_port_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http-port", type=_http_port, metavar="PORT",
                   help="serve /metrics (and the status page) here: 0 any free port, -1 none "
                        "(default: the config's http_port)")


def _connect_url_arg(text: str) -> str:
    from taproot_ops.sparkconnect.client import Url
    try:
        Url.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _endpoint_args(p: argparse.ArgumentParser) -> None:
    """--remote and --local: where `sql` and `replay` run their Spark work."""
    p.add_argument("--remote", metavar="sc://HOST:PORT", type=_connect_url_arg,
                   help="the pipeline's Spark Connect endpoint (default: the config's [pipeline] connect_host and "
                        "connect_port, used when it serves this data directory); when none answers, a Spark of "
                        "its own starts")
    p.add_argument("--local", action="store_true", help="a Spark of its own, not the running cluster's endpoint")


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _server_process() -> None:
    """Before a node or proxy starts a thread: its C allocator tuned
    (`protocol.malloc_tuning`: a thread keeps the malloc arena it took; the
    server logs what was done once it serves), and its threads named to the
    kernel as they start (`protocol.thread_names`: `top -H` tells them apart)."""
    from protocol import malloc_tuning, thread_names
    malloc_tuning.tune()
    thread_names.install()


def cmd_node(args: argparse.Namespace) -> int:
    _logging(args.log_level)
    config = _config(args)
    name = args.name or config.nodes[0].name
    if args.action == "stop":
        from primary.server import stop_node
        return stop_node(config, name)
    _server_process()   # (importing primary.server starts threads)
    from primary.server import serve
    serve(config, name, port=args.port, ready_file=args.ready_file, cluster_file=args.config,
          http_port=args.http_port)
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    _logging(args.log_level)
    _server_process()
    from proxies.server import serve
    config = _config(args)
    names = {p.name for p in config.proxies}
    if args.name and args.name not in names and args.upstream:
        proxy = conf.ProxyConfig(args.name)  # an ad-hoc proxy in front of the given nodes
    else:
        proxy = config.proxy(args.name) if args.name and config.proxies else (
            config.proxies[0] if config.proxies else conf.ProxyConfig("proxy1"))
    if args.upstream:
        upstream = args.upstream
    else:  # every node, the configured upstream first: the proxy fails over along this list
        first = config.node(proxy.upstream) if proxy.upstream else config.nodes[0]
        upstream = [first.address] + [n.address for n in config.nodes if n.name != first.name]
    ha = config.ha
    port = proxy.port if args.port is None else args.port
    http_port = conf.http_port_of(proxy.http_port if args.http_port is None else args.http_port, port)
    tls = conf.server_tls(config)
    serve(proxy.host, port, upstream, ready_file=args.ready_file, limits=ha.retransmission,
          stop_timeout_ms=ha.stop_timeout_ms, max_outbound_bytes=ha.link_outbound_max_bytes, http_port=http_port,
          tls=tls, upstream_tls=conf.client_tls(config), auth=conf.authenticator(config),
          upstream_token=conf.cluster_token(config))
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    _logging(args.log_level)
    from pipelines.runner import run
    return run(_config(args), node_address=args.node_address, ready_file=args.ready_file,
               cluster_file=args.config, warm=not args.no_warm_up, http_port=args.http_port,
               connect_port=args.connect_port)


def _parse_properties(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--property {item!r}: expected name=value")
        if value in ("true", "false"):
            out[name] = value == "true"
        else:
            out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def _client_access(args: argparse.Namespace) -> dict[str, Any]:
    """A client's TLS and token, as the cluster's config says ([tls], [auth])."""
    return conf.client_access(conf.load(args.config, data_dir=args.data_dir))


def _connection_args(p: argparse.ArgumentParser) -> None:
    """--hosts, --connect-timeout and the cluster's TLS and token settings."""
    p.add_argument("--hosts", nargs="+", default=[DEFAULT_HOST], metavar="HOST:PORT",
                   help=f"the cluster's proxies (or nodes), tried in turn (default {DEFAULT_HOST})")
    p.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                   help="give up when no host answers within this many seconds (default 10)")
    _client_args(p)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="the cluster's cluster.toml, for its [tls] and [auth] "
                                    "(default: the shipped one)")
    p.add_argument("--data-dir", help="override cluster.data_dir (where [tls] auto keeps the CA, [auth] auto "
                                      "the local token); a token in TAPROOT_TOKEN or TAPROOT_TOKEN_FILE goes first")


def _payloads(args: argparse.Namespace) -> Iterator[bytes]:
    """`-m TEXT` (`-n` times), `-m -` (each line of stdin, `-n` ignored), or
    'message <i>' `-n` times."""
    if args.message == "-":
        for line in sys.stdin.buffer:
            yield line.rstrip(b"\r\n")
        return
    for i in range(args.count):
        yield args.message.encode() if args.message is not None else f"message {i}".encode()


def _not_reached(exc: Exception, hosts: list[str]) -> str:
    """The error, and for a connection failure what was tried and the likely cause."""
    from taproot import errors
    if isinstance(exc, errors.ConnectionError):
        return (f"error: {exc}\n  tried: {', '.join(hosts)}. Is the cluster running (`taproot run`, or `make "
                "run`)? Elsewhere, give its proxies with --hosts.")
    return f"error: {exc}"


def cmd_produce(args: argparse.Namespace) -> int:
    from taproot import Session, TaprootError
    properties = _parse_properties(args.property)
    try:
        with Session(args.hosts, connect_timeout_s=args.connect_timeout, **_client_access(args)) as session, \
                session.open_queue(args.uri, write=True) as queue:
            futures = []
            for body in _payloads(args):
                posted = time.monotonic()
                future = queue.post(body, properties=properties, compression=args.compression)
                if args.verbose:
                    future.add_done_callback(functools.partial(_said_ack, posted=posted))
                futures.append(future)
            queue.flush()
            failed = 0
            for future in futures:
                try:
                    future.result(timeout=60)
                except TaprootError as exc:
                    failed += 1
                    if not args.verbose:
                        print(f"NACK {exc}", file=sys.stderr)
            print(f"posted {len(futures)}, acked {len(futures) - failed}, failed {failed}")
            return 1 if failed else 0
    except TaprootError as exc:
        print(_not_reached(exc, args.hosts), file=sys.stderr)
        return 2


def _said_ack(future: Any, *, posted: float) -> None:
    """`produce -v`: one line per PUT, its GUID and how long its ACK took."""
    took = (time.monotonic() - posted) * 1000
    error = future.exception()
    print(f"{future.guid_hex} {'NACK ' + str(error) if error is not None else 'ACK'} {took:.1f} ms",
          file=sys.stderr if error is not None else sys.stdout, flush=True)


def _shown(payload: bytes, limit: int = 80) -> str:
    """A payload as a terminal can show it: its text when it is printable
    UTF-8, else hex; cut at `limit` characters, with the size when cut or binary."""
    try:
        text = payload.decode("utf-8")
        if text.isprintable():
            return text if len(text) <= limit else f"{text[:limit]}... ({len(payload)} bytes)"
    except UnicodeDecodeError:
        pass
    shown = payload[: limit // 2].hex()
    return f"hex:{shown}{'...' if len(payload) > limit // 2 else ''} ({len(payload)} bytes)"


def cmd_consume(args: argparse.Namespace) -> int:
    from taproot import Session, TaprootError
    received = 0
    try:
        with Session(args.hosts, connect_timeout_s=args.connect_timeout, **_client_access(args)) as session, \
                session.open_queue(args.uri, read=True, subscription=args.subscription,
                                   consumer_priority=args.priority,
                                   max_unconfirmed_messages=args.max_unconfirmed) as queue:
            for message in queue.messages(timeout_s=args.timeout):
                flag = f" redelivered({message.delivery_count})" if message.redelivered else ""
                flag += f" {message.compression}" if message.compression else ""
                print(f"{message.guid_hex} seq={message.sequence}{flag} {dict(message.properties)} "
                      f"{_shown(message.payload)}", flush=True)
                queue.confirm(message)
                received += 1
                if args.count and received >= args.count:
                    break
    except TaprootError as exc:
        print(_not_reached(exc, args.hosts), file=sys.stderr)
        return 2
    print(f"received and confirmed {received}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate cluster.toml and every domain file; print what they define."""
    config = conf.load(args.config)
    print(f"cluster {config.name!r}: {config.partitions} partition(s), data in {config.data_dir}"
          + (f", this machine's own files in {config.local_dir}" if config.local_dir != config.data_dir else ""))
    for node in config.nodes:
        print(f"  node  {node.name} {node.address}")
    for proxy in config.proxies:
        print(f"  proxy {proxy.name} {proxy.address} -> {proxy.upstream or config.nodes[0].name}")
    for name, d in sorted(config.domains.items()):
        extras = [f"apps {', '.join(d.app_ids)}"] if d.app_ids else []
        extras += [f"subscription {app or '(default)'}: {expr}" for app, expr in d.subscriptions.items()]
        for key in ("queue_max_messages", "queue_max_bytes", "domain_max_messages", "domain_max_bytes",
                    "max_consumers", "max_producers", "message_ttl_ms", "max_delivery_attempts"):
            if getattr(d, key):
                extras.append(f"{key} {getattr(d, key)}")
        mode = d.mode if d.delivery == "express" or d.mode == "broadcast" else f"{d.mode}, delivery = pipeline"
        print(f"  domain {name} ({mode})" + "".join(f"\n    {e}" for e in extras))
    tls = config.tls
    if not tls.enabled:
        print("  tls: off (plaintext on every link)")
    else:
        ca, cert, key = tls.files(config.local_dir)
        mutual = ", mutual (client certificates required)" if tls.client_certs else ""
        if tls.auto and not tls.ca_file and not os.path.exists(ca):
            print(f"  tls: on{mutual}; a throwaway CA is made in {os.path.dirname(ca)} when the cluster starts")
        else:
            conf.server_tls(config)   # each file read and checked: a ConfigError names the one that is not usable
            print(f"  tls: on{mutual}; CA {ca}, certificate {cert}, key {key}")
    for link in config.links:
        conf.link_token(link)   # its token file read: a ConfigError names it
        print(f"  link {link.name} -> {link.cluster} ({link.direction}, {', '.join(link.domains)}): "
              + (f"token from {link.token_file}" if link.token_file else "no token"))
    auth = config.auth
    if not auth.enabled:
        print("  auth: off (no tokens: any client may produce, consume and run admin commands)")
    else:
        tokens_file, cluster_file = auth.files(config.local_dir)
        if auth.auto and not (os.path.exists(tokens_file) and os.path.exists(cluster_file)):
            print(f"  auth: on; the cluster token and a local token are made in {os.path.dirname(tokens_file)} "
                  "when the cluster starts")
        else:
            checked = conf.authenticator(config)   # both files read and checked: a ConfigError names the bad one
            count = len(checked.store.entries) if checked is not None else 0
            print(f"  auth: on; {count} tokens in {tokens_file}, cluster token {cluster_file}")
    print("configuration OK")
    return 0


def cmd_tls(args: argparse.Namespace) -> int:
    """`taproot tls init`: a throwaway CA and the cluster's certificate, for
    a cluster with `[tls] auto` (the embedded cluster makes them itself)."""
    from taproot_ops import tls_init

    config = _config(args)
    if not (config.tls.enabled and config.tls.auto) or config.tls.ca_file:
        print("tls init: this cluster's [tls] does not use auto files (enabled = true, auto = true, no ca_file)",
              file=sys.stderr)
        return 2
    ca, cert, key = config.tls.files(config.local_dir)
    if os.path.exists(ca) and not args.force:
        print(f"tls init: {ca} exists; --force makes new ones (every client must then get the new CA)")
        return 0
    tls_init.make(Path(ca).parent, tls_init.host_names(config), config.name)
    print(f"made {ca} (the CA clients trust), {cert} and {key} (every role's certificate and key)")
    return 0


# How long a Spark session takes to start here (a JVM, Delta's jars), for the live line.
SPARK_START_USUALLY_S = 15


def _spark(app_name: str, config: conf.ClusterConfig) -> Any:
    """A Spark session for a one-shot command, where `[pipeline]
    spark_master` says (local by default), with a live line on stderr while
    the JVM starts; what the JVM prints goes to <state_dir>/logs/APP.log."""
    from storage import spark as spark_factory
    from taproot_ops.console import Waiting, output_to

    # PySpark logs every failed query's whole plan as one JSON line; callers print the error.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    log_file = Path(config.local_dir) / "logs" / f"{app_name}.log"
    with output_to(log_file, show_on=2) as terminal:
        with Waiting(f"starting Spark (a JVM; its output goes to {log_file})", SPARK_START_USUALLY_S,
                     stream=terminal, indent=""):
            return spark_factory.session(app_name, **conf.spark_options(config))


def cmd_sql(args: argparse.Namespace) -> int:
    """Run one Spark SQL query against the Taproot views: on the running
    pipeline's Spark Connect endpoint when one answers (its views are
    registered there, its JVM warm; `taproot_ops.sparkconnect`, a thin
    client), else on a local Spark of its own."""
    config = _config(args)
    with _endpoint(args, config, thin=True) as remote:
        if remote is not None:
            return _sql_remote(remote, args)
    from storage.views import register_views

    spark = _spark("taproot-sql", config)
    try:
        from taproot_ops.console import Waiting
        with Waiting("reading the tables' logs for the views", stream=sys.stderr, indent=""):
            register_views(spark, config.data_dir, list(range(config.partitions)) if args.config else None)
        return _sql(spark, args)
    finally:
        spark.stop()


@contextlib.contextmanager
def _endpoint(args: argparse.Namespace, config: conf.ClusterConfig, thin: bool = False) -> Iterator[Any]:
    """A Spark Connect session on the running pipeline's endpoint (`--remote`,
    else the config's when it serves this data directory), or None, having
    said why, when a Spark of its own must start instead (not with `--local`).
    With `thin`, `taproot sql`'s own client (`taproot_ops.sparkconnect`),
    else pyspark's."""
    from storage.tables import absolute

    url = args.remote or (None if args.local else conf.connect_url(config))
    if url is None:
        yield None
        return
    if not _answers(url):
        print(f"no Spark Connect endpoint answers at {url} (is the cluster's pipeline running?): "
              "starting a Spark of its own instead", file=sys.stderr)
        yield None
        return
    token = conf.connect_token(config)
    if thin:
        from taproot_ops.sparkconnect.client import Endpoint
        session: Any = contextlib.closing(Endpoint(url, token=token))
    else:
        from storage.spark import remote_session
        logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # callers print the error
        session = remote_session(conf.with_connect_token(url, token))
    with session as remote:
        try:
            served = _served_data_dir(remote)
        except EndpointUnavailable as exc:
            if args.remote:
                raise EndpointUnavailable(f"the Spark Connect endpoint at {url} does not answer queries: {exc}") \
                    from None
            print(f"the Spark Connect endpoint at {url} does not answer queries ({exc}): "
                  "starting a Spark of its own instead", file=sys.stderr)
        else:
            if args.remote or served == absolute(config.data_dir):
                yield remote
                return
            print(f"the Spark Connect endpoint at {url} serves {served or 'no Taproot views yet'}, not "
                  f"{absolute(config.data_dir)}: starting a Spark of its own instead", file=sys.stderr)
    yield None


def _answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections at sc://host:port."""
    import socket
    host, _, port = url.removeprefix("sc://").split("/", 1)[0].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class EndpointRefused(Exception):
    """The endpoint refused this client (UNAUTHENTICATED: no token, or a wrong one)."""


class EndpointUnavailable(Exception):
    """The endpoint accepts connections but answers no query (UNAVAILABLE
    after the bounded retries of `storage.spark.remote_session`)."""


def _served_data_dir(spark: Any) -> str | None:
    """The data directory whose tables an endpoint's views read (None: it has
    no Taproot views yet); EndpointRefused when it wants a token this client
    does not have (a Spark of its own would only hide that)."""
    try:
        answer = spark.sql("SELECT data_dir FROM taproot__cluster")
        return str(answer.first()[0] if hasattr(answer, "first") else answer.column(0)[0].as_py())
    except Exception as exc:  # not registered yet, or not a Taproot endpoint
        from storage.spark import unavailable
        if said := unavailable(exc):
            raise EndpointUnavailable(said) from None
        if "authentication token" in str(exc):   # Spark's words: "No authentication token provided", "Invalid ..."
            said = "no token was presented" if "No authentication" in str(exc) else "the token presented is wrong"
            raise EndpointRefused(
                f"the Spark Connect endpoint requires a token ([auth] is on) and {said}: set "
                f"{conf.CONNECT_TOKEN_ENV} to the endpoint's token (the file [auth] connect_token_file "
                "names; with auto, <state_dir>/auth/connect.token), or use --local") from None
        return None


# A query on the endpoint reads the Delta tables with Delta's Kernel-based
# connector (`DELTA_CONNECTOR_MODE` STRICT, in this Connect
# session only): it lists a table's files in the driver, where the classic
# connector runs a Spark job per table, about 100 ms each here, and the
# backlog view reads three (docs/benchmarks.md, issue 22). Delta calls the
# mode a testing mode and it cannot run DESCRIBE HISTORY, DELETE and the like,
# so only queries use it, and a query it fails is run again the classic way.
_QUERY_START = re.compile(r"\s*\(*\s*(select|with|table|values|from)\b", re.IGNORECASE)
# Errors the classic connector would give too: no second run for them.
_SAME_EITHER_WAY = ("TABLE_OR_VIEW_NOT_FOUND", "PARSE_SYNTAX_ERROR", "UNRESOLVED_", "AUTHENTICAT", "PATH_NOT_FOUND",
                    "DELTA_PATH_DOES_NOT_EXIST")


def _sql_remote(endpoint: Any, args: argparse.Namespace) -> int:
    """`_sql` on the thin client: Spark formats the table (ShowString), as `show()` would."""
    from taproot_ops.sparkconnect.client import ConnectError
    try:
        if args.query.strip().lower() in ("views", "show views"):
            print("\n".join(f"{v}: {', '.join(endpoint.columns(v))}" for v in _remote_views(endpoint)))
            return 0
        kernel = not args.classic_reads and _QUERY_START.match(args.query) is not None
        if kernel:
            endpoint.sql(f"SET {DELTA_CONNECTOR_MODE}=STRICT")
        try:
            answer = _remote_answer(endpoint, args)
        except ConnectError as exc:
            if not kernel or any(code in str(exc) for code in _SAME_EITHER_WAY):
                raise
            print(f"note: Delta's Kernel connector could not run this query ({_first_line(str(exc))}); "
                  "running it with the classic one (--classic-reads does so from the start)", file=sys.stderr)
            endpoint.sql(f"SET {DELTA_CONNECTOR_MODE}=NONE")
            answer = _remote_answer(endpoint, args)
        print(answer, end="")
        return 0
    except ConnectError as exc:
        said = f"error: {_first_line(str(exc))}"
        if "TABLE_OR_VIEW_NOT_FOUND" in str(exc):
            said += _VIEWS_HINT.format(views=", ".join(_remote_views(endpoint)))
        print(said, file=sys.stderr)
        return 2


def _remote_answer(endpoint: Any, args: argparse.Namespace) -> str:
    """The query's rows as `taproot sql` prints them: JSON lines, or Spark's table."""
    if args.json:
        return "".join(line + "\n" for line in endpoint.json_lines(args.query, args.limit))
    return str(endpoint.show(args.query, args.limit, args.truncate or 0, args.vertical))


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), text)


_VIEWS_HINT = ("\n  the views: {views} (`taproot sql views` lists their columns); "
               "a table by path: delta.`<data_dir>/partition-000/puts`")


def _sql(spark: Any, args: argparse.Namespace) -> int:
    """The query (or `views`) on a session with the views, printed as asked."""
    try:
        if args.query.strip().lower() in ("views", "show views"):
            print("\n".join(f"{v}: {', '.join(spark.table(v).columns)}" for v in _views(spark)))
            return 0
        result = spark.sql(args.query)
        if args.json:
            from pyspark.sql import functions as F
            for row in result.limit(args.limit).select(F.to_json(F.struct("*"))).collect():
                print(row[0])
        else:
            result.show(args.limit, truncate=args.truncate or False, vertical=args.vertical)
        return 0
    except Exception as exc:  # Spark's AnalysisException and parse errors: say what was wrong
        print(_sql_error(exc, spark), file=sys.stderr)
        return 2


def _views(spark: Any) -> list[str]:
    """The Taproot views this session has (not the helper views, `taproot__*`)."""
    return _taproot_only(t.name for t in spark.catalog.listTables())


def _remote_views(endpoint: Any) -> list[str]:
    """`_views` on the thin client."""
    return _taproot_only(endpoint.sql("SHOW VIEWS").column("viewName").to_pylist())


def _taproot_only(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if n.startswith("taproot_") and not n.startswith("taproot__"))


def _sql_error(exc: Exception, spark: Any) -> str:
    """Spark's first line, and for a table or view it does not know the views there are."""
    said = f"error: {_first_line(str(exc))}"
    if "TABLE_OR_VIEW_NOT_FOUND" in str(exc):
        said += _VIEWS_HINT.format(views=", ".join(_views(spark)))
    return said


def cmd_maintain(args: argparse.Namespace) -> int:
    """Retention and maintenance by hand (the running pipeline also schedules it)."""
    _logging(args.log_level)
    from pipelines.retention import maintain

    config = _config(args)
    spark = _spark("taproot-maintain", config)
    try:
        report = maintain(spark, config, vacuum_retention_hours=args.vacuum_retention_hours)
    finally:
        spark.stop()
    print(report.summary())
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Post a queue's history into a queue through the normal PUT path (Spark selects it)."""
    from pipelines.replay import ReplayError, print_progress, replay

    config = _config(args)

    def run(spark: Any) -> int:
        try:
            result = replay(spark, config.data_dir, config.partitions, args.hosts, args.source, args.target,
                            since=args.since, until=args.until, version=args.version, where=args.where,
                            rate=args.rate, original_rate=args.original_rate, progress=print_progress,
                            **conf.client_access(config))
        except ReplayError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # a bad --where, a version that does not exist: Spark says which
            from storage.spark import unavailable
            print(f"error: {unavailable(exc) or str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        print(result.summary())
        return 1 if result.failed else 0

    # The running pipeline's Spark selects the history when it serves these tables (no JVM to start).
    with _endpoint(args, config) as remote:
        if remote is not None:
            return run(remote)
    spark = _spark("taproot-replay", config)
    try:
        return run(spark)
    finally:
        spark.stop()


def cmd_run(args: argparse.Namespace) -> int:
    from taproot_ops.demo import run_embedded
    return run_embedded(args.config, args.data_dir or "data", demo_messages=args.demo_messages)


def cmd_bench(args: argparse.Namespace) -> int:
    """A SIGTERM (`timeout`, a CI runner, `kill`) stops a run as Ctrl-C
    does: its client processes and its embedded cluster are stopped on the
    way out, not left running after it. A second SIGTERM during that stop
    is ignored, so it cannot cut the stop short (each server gets SIGKILL
    after its own stop timeout)."""
    import signal

    from taproot_ops.bench import main as bench_main

    def interrupted(_signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        return bench_main(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


START_HERE = """start here:
  taproot run                                   an embedded cluster in ./data with demo traffic (Ctrl-C stops it)
  taproot produce --uri taproot://demo/orders -m hello
  taproot consume --uri taproot://demo/orders
  taproot check-config --config conf/           validate a cluster's files
  taproot COMMAND --help                        each command's options
docs: README.md, docs/operations.md, docs/deploy.md"""


def _examples(*commands: str, note: str = "") -> dict[str, Any]:
    """A subcommand's `add_parser` keywords for help that ends with examples
    (and a `note`), kept as written."""
    text = "example:" if len(commands) == 1 else "examples:"
    return {"formatter_class": argparse.RawDescriptionHelpFormatter,
            "epilog": "\n  ".join([text, *commands]) + (f"\n{note}" if note else "")}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("taproot")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked: reading the package metadata
    costs about 30 ms, which every other command (`taproot sql` on a warm
    endpoint answers in about a second) would pay for nothing."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the program's version number and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"taproot {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taproot", description="Taproot: a Spark-native message queue",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=START_HERE)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run an embedded cluster with demo traffic until Ctrl-C",
                       **_examples("taproot run --data-dir /tmp/taproot-demo --demo-messages 500"))
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.add_argument("--data-dir", help="data directory (default ./data)")
    p.add_argument("--demo-messages", type=int, default=2000, help="demo messages to send (0: none)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("node", help="run a cluster node, or stop one gracefully (`taproot node stop --name N`)",
                       **_examples("taproot node --config conf/cluster.toml --name node2",
                                   "taproot node stop --config conf/cluster.toml --name node2"))
    p.add_argument("action", nargs="?", choices=["run", "stop"], default="run",
                   help="stop: drain the running node NAME (StopRequest to its peers, then hand its "
                        "partitions over) and wait for it to exit")
    _server_args(p)
    p.add_argument("--name", help="which of the config's [[nodes]] this is (default: the first)")
    p.add_argument("--port", type=int, help="gRPC port (default: the node's port in the config; 0 any free one)")
    _http_port_arg(p)
    p.set_defaults(func=cmd_node)

    p = sub.add_parser("proxy", help="run a proxy",
                       **_examples("taproot proxy --config conf/cluster.toml --name proxy1"))
    _server_args(p)
    p.add_argument("--name", help="which of the config's [[proxies]] this is (default: the first)")
    p.add_argument("--port", type=int, help="gRPC port (default: the proxy's port in the config; 0 any free one)")
    p.add_argument("--upstream", nargs="+", metavar="HOST:PORT",
                   help="nodes to connect to, tried in turn (default: every node of the config, "
                        "the proxy's upstream first)")
    _http_port_arg(p)
    p.set_defaults(func=cmd_proxy)

    p = sub.add_parser("pipeline", help="run the Spark dedup pipeline")
    _server_args(p)
    p.add_argument("--node-address", help="primary host:port to notify (default: first node)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="skip the JIT warm-up on scratch tables (ready ~25 s sooner; the first batches are slower)")
    _http_port_arg(p)
    p.add_argument("--connect-port", type=_http_port, metavar="PORT",
                   help="serve Spark Connect with the Taproot views here: 0 any free port, -1 none "
                        "(default: the config's [pipeline] connect_port)")
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("produce", help="post messages",
                       **_examples("taproot produce --uri taproot://demo/orders -m hello -p region=EU",
                                   "taproot produce --uri taproot://demo/orders -n 1000 -v",
                                   "seq 5 | taproot produce --uri taproot://demo/orders -m -"))
    _connection_args(p)
    p.add_argument("--uri", required=True, help="the queue, taproot://<domain>/<queue>")
    p.add_argument("-n", "--count", type=int, default=1, help="messages to post (default 1; not with -m -)")
    p.add_argument("-m", "--message", metavar="TEXT",
                   help="the payload; '-' posts each line of stdin (default: 'message <i>')")
    p.add_argument("-p", "--property", action="append", metavar="NAME=VALUE",
                   help="a message property (repeatable); integers and true/false are typed")
    p.add_argument("--compression", choices=["zlib", "zstd"], help="compress payloads of 1 KiB or more")
    p.add_argument("-v", "--verbose", action="store_true", help="print each PUT's GUID and ACK time")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print and confirm messages",
                       **_examples("taproot consume --uri taproot://demo/orders --timeout 10",
                                   "taproot consume --uri 'taproot://events/orders?id=eu' --subscription 'amount > 10' "
                                   "-n 5",
                                   note="each line: GUID, seq, properties, then the payload: its text, or hex and "
                                        "size if it is binary"))
    _connection_args(p)
    p.add_argument("--uri", required=True, help="the queue, taproot://<domain>/<queue>[?id=<app>]")
    p.add_argument("-n", "--count", type=int, default=0, help="stop after this many (default 0: no limit)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after this many idle seconds (default: wait until Ctrl-C)")
    p.add_argument("--subscription", action="append",
                   help="filter expression, e.g. \"region = 'EU'\" (repeatable: OR)")
    p.add_argument("--priority", type=int, help="consumer priority (default 0)")
    p.add_argument("--max-unconfirmed", type=int, help="max unconfirmed messages (default: the domain's, 1000)")
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser("sql", help="query the queues as tables (Spark SQL, with the taproot_* views)")
    p.add_argument("query", help="a Spark SQL query, e.g. \"SELECT * FROM taproot_backlog\"; 'views' lists them")
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.add_argument("--data-dir", help="data directory (default: the config's)")
    p.add_argument("--limit", type=int, default=20, help="rows to show")
    p.add_argument("--truncate", type=int, default=0, help="truncate cells to this many characters (0: never)")
    p.add_argument("--vertical", action="store_true", help="one line per column")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.add_argument("--classic-reads", action="store_true",
                   help="read Delta tables with Delta's classic connector only (by default a query on the "
                        "endpoint reads them with Delta's Kernel connector, about 200 ms faster on the views)")
    _endpoint_args(p)
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("replay", help="post a queue's history (selected by Spark) into a queue")
    p.add_argument("--from", dest="source", required=True, help="source queue URI")
    p.add_argument("--to", dest="target", required=True, help="target queue URI")
    p.add_argument("--since", help="PUT time lower bound (inclusive), e.g. 2026-11-21T10:00:00")
    p.add_argument("--until", help="PUT time upper bound (exclusive)")
    p.add_argument("--version", type=int, help="the delivery log as of this table version (time travel)")
    p.add_argument("--where", help="Spark SQL predicate, e.g. \"properties['region'] = 'EU'\"")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--rate", type=float, default=0.0, help="msg/s (default 0: as fast as ACKs allow)")
    pace.add_argument("--original-rate", action="store_true", help="keep the original spacing of the PUTs")
    p.add_argument("--hosts", nargs="+", default=[DEFAULT_HOST], metavar="HOST:PORT",
                   help=f"where to post: the cluster's proxies (or nodes), tried in turn (default {DEFAULT_HOST})")
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.add_argument("--data-dir", help="data directory (default: the config's)")
    _endpoint_args(p)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("maintain", help="remove finished history past retention, compact, vacuum")
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.add_argument("--data-dir", help="data directory (default: the config's)")
    p.add_argument("--vacuum-retention-hours", type=int, help="override maintenance.vacuum_retention_hours")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="what it logs while it works (default WARNING)")
    p.set_defaults(func=cmd_maintain)

    from taproot_ops import admin, tokens
    admin.add_parser(sub)
    tokens.add_parser(sub)

    p = sub.add_parser("tls", help="`tls init`: a throwaway CA and certificate for [tls] auto")
    p.add_argument("action", choices=["init"])
    p.add_argument("--config", help="cluster.toml (default: the shipped one)")
    p.add_argument("--data-dir", help="override cluster.data_dir (the files go in <data_dir>/tls)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.set_defaults(func=cmd_tls)

    p = sub.add_parser("check-config", help="validate cluster.toml and the domain files")
    p.add_argument("--config", help="cluster.toml (default: the one shipped in conf/)")
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("bench", help="load tool: msg/s and PUT->ACK / PUT->PUSH latency, optionally vs peers",
                       description="Producers and consumers as separate processes; BlazingMQ's scenarios; "
                                   "Kafka, NATS and RabbitMQ with their own load tools beside Taproot with "
                                   "--compare.")
    p.add_argument("--scenario", nargs="+", metavar="NAME",
                   help="all (BlazingMQ's table), queues (1 to 10,000 queues over the same 4 clients), or: "
                        "priority-1q priority-10q priority-100q fanout-5c fanout-30c broadcast-1c broadcast-5c "
                        "queues-1 queues-10 queues-100 queues-1000 queues-10000, and Taproot-only fanout-5c-subs "
                        "(five apps, three with subscriptions; each app checks it got exactly what its rule "
                        "matches) "
                        "(default: priority-1q)")
    p.add_argument("--mode", choices=["priority", "fanout", "broadcast"], help="a custom scenario instead")
    p.add_argument("--queues", type=int, help="custom scenario: queues")
    p.add_argument("--producers", type=int, help="custom scenario: producers per queue")
    p.add_argument("--consumers", type=int, help="custom scenario: consumers per queue (fanout: apps)")
    p.add_argument("--queues-per-client", type=int,
                   help="custom scenario, Taproot only: queues each producer and consumer session serves "
                        "(default 1; the 'queues' scenarios use up to 5000)")
    p.add_argument("--size", type=int, help="payload bytes (default 1024)")
    p.add_argument("--batch", type=int, help="messages the Taproot SDK batches per PUT frame (default 1000)")
    p.add_argument("--window", type=int, help="unacknowledged PUTs per producer, every system (default 10000)")
    p.add_argument("--rate", type=float, help="msg/s over all producers (default 0: max)")
    p.add_argument("--duration", type=float, help="seconds of producing (default 10)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the scenarios N times, in turn (a, b, a, b, ...) on the same cluster, then print each "
                        "scenario's figures as median (min-max) with every run's value; results.json gets 'spread' "
                        "(default 1). Runs on a shared machine differ by tens of percent: compare ranges, not runs")
    p.add_argument("--workers", type=int, default=2, help="processes per role (clients are spread over them)")
    p.add_argument("--client-gc", choices=["tuned", "default"], default="tuned",
                   help="the load generator's processes, every system's: tuned (default), the garbage collector "
                        "frozen and tuned as `taproot.tune_gc` does, before they connect; default, the "
                        "interpreter's settings (the figures in docs/benchmarks.md before 2026-12-04's thirteenth "
                        "session)")
    p.add_argument("--malloc", choices=["tuned", "default"], default="tuned",
                   help="the C allocator of every process the bench starts (the embedded cluster's roles and the "
                        "load generator; with --hosts, the load generator only): tuned (default), as the servers "
                        "and `taproot.tune_malloc` tune it; default, glibc's own settings "
                        "(TAPROOT_MALLOC_TUNING=off; the figures in docs/benchmarks.md before 2026-12-06)")
    p.add_argument("--drain-idle", type=float, help="consumers stop after this long without a message once "
                                                     "the producers are done (default 60 s Taproot, 10 s peers)")
    p.add_argument("--system", choices=["taproot", "rabbitmq", "nats", "kafka", "nats-native", "rabbitmq-native"],
                   help="only this system; kafka: a KRaft broker from Maven Central's jars driven by Kafka's own "
                        "load tools (its own runs: one topic, 10 partitions, fanout to 5 groups, 10k msg/s, with "
                        "and without fsync; taproot_ops/bench/kafka.py); nats-native: a current nats-server "
                        "built from the Go module proxy, driven by `nats bench` (taproot_ops/bench/nats_native.py); "
                        "rabbitmq-native: quorum queues driven by RabbitMQ's PerfTest "
                        "(taproot_ops/bench/rabbitmq_native.py)")
    p.add_argument("--compare", action="store_true",
                   help="Kafka, NATS JetStream and RabbitMQ quorum queues, each driven by its own load tools, then "
                        "Taproot, on the same work (1 KiB; one and ten queues, fanout to 5, 10k msg/s paced; "
                        "--duration seconds each), one table per scenario with Taproot/peer ratios "
                        "(taproot_ops/bench/compare.py; about 15 minutes)")
    p.add_argument("--compare-python", action="store_true",
                   help="also RabbitMQ quorum queues and NATS JetStream (installed from Debian and started on "
                        "loopback if needed) through Python clients (pika, nats-py), the same --scenario, and "
                        "Taproot/peer ratios")
    p.add_argument("--hosts", nargs="+", help="a running Taproot cluster (default: start an embedded one)")
    p.add_argument("--data-dir", help="embedded cluster data dir (default: a temp dir)")
    p.add_argument("--tls", action="store_true",
                   help="the embedded cluster with TLS on every link, as shipped (default: plaintext, as the "
                        "figures in docs/benchmarks.md before 2026-11-24 were measured)")
    p.add_argument("--auth", action="store_true",
                   help="the embedded cluster with token auth, as shipped (its clients present the local token; "
                        "default: no tokens)")
    p.add_argument("--object-store", action="store_true",
                   help="the embedded cluster's tables on an S3 object store (SeaweedFS on loopback, built once "
                        "from the Go module proxy; docs/deploy.md)")
    p.add_argument("--spark-cluster", action="store_true",
                   help="the pipeline on a Spark standalone cluster (master and worker on loopback, every core) "
                        "instead of Spark in local mode")
    p.add_argument("--no-pipeline", action="store_true",
                   help="the embedded cluster without its Spark pipeline: the express lane alone delivers and no "
                        "authority lag is measured (what the pipeline's JVM costs the node's and proxy's latency)")
    p.add_argument("--sql-every", type=float, default=0.0, metavar="S",
                   help="the embedded cluster: while the runs go, `taproot sql` queries taproot_backlog on the "
                        "pipeline's Spark Connect endpoint every S seconds (what sharing the pipeline's Spark costs)")
    p.add_argument("--set", action="append", default=[], dest="settings", metavar="SECTION.KEY=VALUE",
                   help="the embedded cluster: one setting of the shipped cluster.toml changed, a TOML value "
                        "(e.g. primary.compact_every_commits=0, or primary.durability='\"os\"'), or with the section "
                        "domain one of the scenarios' domains (e.g. domain.dedup_history_window_ms=60000); "
                        "again for more")
    p.add_argument("--config", help="cluster.toml (--replay, or with --hosts)")
    p.add_argument("--out", help="directory for results.json and the PNG plots")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--replay", type=int, default=0, metavar="N",
                   help="instead: fill a queue with N messages of --size (default 32), then time replay of it")
    p.add_argument("--pipeline", type=int, default=0, metavar="N",
                   help="instead: the dedup pipeline alone over a PUT log of N rows written as the primary "
                        "writes it (commits of --batch rows, default 1000; --size, default 1024): the JVM's "
                        "CPU per row, marginal over a pass of N/3")
    p.add_argument("--history", type=int, default=0, metavar="N",
                   help="instead: the dedup pipeline over a PUT log of N rows in micro-batches of --per-batch "
                        "rows (commits of --batch rows, default 10000; --size, default 16), printing per batch "
                        "the GUIDs its history holds and the time spent expiring them")
    p.add_argument("--per-batch", type=int, default=100_000, metavar="ROWS",
                   help="--history: rows per micro-batch (default 100000; a multiple of --batch)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:          # bare `taproot`: what it can do, and where to start
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except conf.ConfigError as exc:
        if len(exc.problems) == 1:
            print(f"configuration error: {exc}", file=sys.stderr)
        else:
            print(f"configuration errors ({len(exc.problems)}):\n" + "\n".join(f"  {p}" for p in exc.problems),
                  file=sys.stderr)
        return 2
    except ClusterStartError as exc:
        print(f"taproot {args.command}: the embedded cluster did not start: {exc}", file=sys.stderr)
        return 1
    except EndpointRefused as exc:
        print(f"error: UNAUTHENTICATED: {exc}", file=sys.stderr)
        return 2
    except EndpointUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:
        if exc.name not in SERVER_MODULES:
            raise
        print(f"taproot {args.command}: needs {exc.name}, which comes with the server extra: "
              "pip install 'taproot[server]' (`make run` and `make test` install it)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
