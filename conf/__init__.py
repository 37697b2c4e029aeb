"""Cluster and domain configuration: loaded, validated and frozen in one place.

Files (TOML):
- `cluster.toml`: the cluster (data directory, partitions), its nodes, proxies,
  the primary's group-commit limits and the pipeline's trigger. See the
  commented file shipped in this package for every field and its default.
- `domains/<name>.toml`: one file per domain; the file name is the domain name.

Every error is a `ConfigError` whose message names the file and the field
(`cluster.toml: primary.group_commit_max_messages: must be >= 1, got 0`).
Unknown fields are errors too: a typo must not silently fall back to a default.

Everything imports it; it takes the protocol's constants, limits and
expression language (to check subscriptions) and nothing else.

Imports: protocol.
Never: pyspark, delta, deltalake, grpc.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import tomllib

from protocol import limits
from protocol.retransmit import RetransmissionLimits
from protocol.uri import CLUSTER_RE, DOMAIN_RE

if TYPE_CHECKING:
    from protocol.auth import Authenticator
    from protocol.tls import ClientTls, ServerTls

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_CLUSTER_FILE = PACKAGE_DIR / "cluster.toml"

DOMAIN_NAME_RE = DOMAIN_RE
QUEUE_MODES = ("priority", "fanout", "broadcast")
DELIVERY_MODES = ("express", "pipeline")
# "fsync": an ACK means the PUT's data file, its commit and their directory
# entries are on stable storage (storage/deltars.py). "os": delta-rs writes
# and the OS flushes when it likes: a power loss may lose ACKed PUTs.
DURABILITY_MODES = ("fsync", "os")
DEFAULT_HISTORY_WINDOW_MS = limits.DEDUP_HISTORY_WINDOW_MS


class ConfigError(ValueError):
    """A configuration file or value is invalid. Each problem names its field
    (`problems`, one line each in the message): a file is checked whole, so
    every problem in it is reported at once."""

    def __init__(self, problems: "str | Sequence[str]"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    def within(self, where: str) -> "ConfigError":
        """The same problems, each said to be in `where` (a file)."""
        return ConfigError([p if p.startswith(where) else f"{where}: {p}" for p in self.problems])


class _Problems:
    """Collects the problems of one file: `check` runs a step and keeps its
    ConfigError's problems (returning `fallback`), so the later steps still
    run; `raise_any` ends the file's check."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, step: "Callable[[], Any]", fallback: Any = None) -> Any:
        try:
            return step()
        except ConfigError as exc:
            self.found.extend(exc.problems)
            return fallback

    def raise_any(self) -> None:
        if self.found:
            raise ConfigError(self.found)


# A role's HTTP port (metrics, status page): -1 none, 0 any free port. Not
# set: the gRPC port + HTTP_PORT_OFFSET (any free one when that is 0).
HTTP_PORT_FROM_GRPC = -2
HTTP_PORT_OFFSET = 10


def http_port_of(http_port: int, grpc_port: int) -> int | None:
    """The HTTP port a node or proxy binds (0: any free), None: no HTTP."""
    if http_port == HTTP_PORT_FROM_GRPC:
        return grpc_port + HTTP_PORT_OFFSET if grpc_port else 0
    return None if http_port < 0 else http_port


@dataclass(frozen=True)
class NodeConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 30114
    http_port: int = HTTP_PORT_FROM_GRPC

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ProxyConfig:
    name: str
    host: str = "127.0.0.1"
    port: int = 30115
    upstream: str = ""  # node name; "" means the first node
    http_port: int = HTTP_PORT_FROM_GRPC

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PrimaryConfig:
    # A group commit closes when it holds this many messages or bytes, or when
    # its first PUT has waited group_commit_linger_ms: whichever comes first.
    group_commit_max_messages: int = 20_000
    group_commit_max_bytes: int = 64 * 1024 * 1024
    group_commit_linger_ms: int = 2
    # ... unless it already holds this many: a bulk producer's frame commits
    # at once instead of waiting out the linger for company it rarely gets.
    group_commit_eager_messages: int = 256
    # ... and waits up to this long instead while the node spends most of a
    # core and PUTs arrive while commits run (streaming or many producers):
    # each commit costs a few ms of CPU whatever its size (0: never).
    group_commit_busy_linger_ms: int = 20
    # CONFIRMs wait longer: nobody waits on their commit, and each delta-rs
    # commit costs the node 20-30 ms of CPU whatever its size (measured with
    # delta-rs 1.6.6), so committing them as often as PUTs took as much CPU.
    # A confirm not yet committed when a primary dies is delivered again.
    confirm_commit_linger_ms: int = 100
    # How often the delivery log is tailed when no notice arrives from the pipeline.
    delivery_poll_interval_ms: int = 200
    # Bound on PUTs waiting for a commit; beyond it PUTs are NACKed with LIMIT_MESSAGES.
    pending_puts_max: int = 200_000
    # Compact the PUT and confirm tables after this many commits (0: never).
    # Without it commit latency grows with the number of small files; files of
    # compact_target_file_bytes or more are left alone, which bounds rewrites.
    compact_every_commits: int = 50
    compact_target_file_bytes: int = 16 * 1024 * 1024
    # The PUT and confirm logs keep commit files this long past the newest
    # checkpoint no reader needs any more (the dedup stream, a primary taking
    # over), then the node deletes them
    # (primary/compaction.py): on a local disk every commit lists the whole
    # _delta_log, so a log kept by Delta's 30-day default slows each commit
    # as it ages. Long enough for a reader to read the files it just listed;
    # each second costs up to ~40 more entries to list per commit (one
    # commit per PUT at low rates). Time travel on these tables reaches back
    # this far. At least 5 s.
    log_retention_s: int = 10
    # What an ACK promises about a power loss (DURABILITY_MODES): "fsync"
    # (each group commit fsynced before its ACKs) or "os" (faster, not safe
    # against a power loss or a kernel crash; a process crash loses nothing).
    durability: str = "fsync"


@dataclass(frozen=True)
class PipelineConfig:
    # Between micro-batch starts. A micro-batch costs 1-2 core-seconds in local
    # mode whatever its size, and the express lane pushes without waiting for
    # it, so the pipeline runs every 5 s. Measured on the 2-core dev machine:
    # the dedup query alone at 10k msg/s a minute after start took 1.34 cores
    # at 100 ms (batches back to back), 0.83 at 2 s, 0.68 at 3 s; the whole
    # pipeline in 5 minutes at 20k msg/s, 1.0 core at 2 s (batches of 2-3 s
    # back to back) and 0.61 at 5 s, with the authority lag's p99 3.8 -> 5.9 s.
    # Lower it for `delivery = "pipeline"` domains that want Spark's decisions
    # sooner; 0 polls back to back.
    trigger_interval_ms: int = 5000
    shuffle_partitions: int = 2       # fixed per checkpoint once it exists
    max_files_per_trigger: int = 1000
    http_port: int = 30126            # metrics; -1 none, 0 any free port
    http_host: str = "127.0.0.1"
    # Spark Connect (docs/tables.md): the pipeline's warm Spark serves the
    # Taproot views to `taproot sql` and to notebooks
    # (`SparkSession.builder.remote("sc://host:port")`). -1: none; 0: any free
    # port (the pipeline's ready file says which). Loopback by default; with
    # [auth] on the endpoint requires `[auth] connect_token_file`'s token, and
    # only then may connect_host be another address.
    connect_port: int = 30127
    connect_host: str = "127.0.0.1"
    # Where the pipeline's Spark runs (and `taproot sql`, `replay`,
    # `maintain`): "local[*]" in the process itself; "spark://host:7077" a
    # standalone cluster (docs/deploy.md). Under spark-submit its --master
    # and --conf win over these.
    spark_master: str = "local[*]"
    driver_host: str = "127.0.0.1"    # the address a cluster's executors reach the driver at (bound too)
    executor_memory: str = ""         # e.g. "2g"; "": Spark's default (1g)
    executor_cores: int = 0           # 0: Spark's default (standalone: every core of a worker)
    # Cores the application takes from the cluster in all (spark.cores.max);
    # 0: Spark's default, which on a standalone cluster is every free core,
    # leaving none for `taproot sql` or a second pipeline while it runs.
    max_cores: int = 0
    # The pipeline's CPU priority on a shared machine: its process and the
    # Spark JVM it starts run at this nice value (0-19), and, when it leads a
    # session of its own (`make run` starts it so), the Linux autogroup of
    # that session too, since with autogroups (most desktop and VM kernels)
    # a process's nice only ranks it within its session. The express lane
    # pushes without waiting for the pipeline, which is a throughput job:
    # at 10k msg/s on 2 cores its JVM took 1.3 cores at nice 0 and
    # lengthened the primary's PUT->ACK p99 (docs/benchmarks.md). 0: the
    # same priority as the other roles.
    cpu_nice: int = 19
    # While the pipeline yields (cpu_nice above 0, in a session it leads)
    # and its authority lag (the age of the oldest PUT it has not judged)
    # reaches this many seconds, its session takes an equal CPU share again
    # (autogroup nice 0) until the lag is back under half of it: on a
    # machine the node and the proxy saturate, yielding alone lets the lag
    # grow without bound. 0: yield always.
    cpu_full_share_lag_s: int = 60

    def spark_options(self) -> dict[str, Any]:
        """`storage.spark.session`'s keyword arguments for these settings."""
        extra = {"spark.executor.memory": self.executor_memory} if self.executor_memory else {}
        if self.executor_cores:
            extra["spark.executor.cores"] = str(self.executor_cores)
        if self.max_cores:
            extra["spark.cores.max"] = str(self.max_cores)
        return {"master": self.spark_master, "driver_host": self.driver_host, "extra_conf": extra}


@dataclass(frozen=True)
class TlsConfig:
    # TLS on every gRPC link (docs/operations.md). One certificate serves
    # every role; its names must cover every node and proxy host.
    enabled: bool = False
    # Without files given: a throwaway CA and certificate under
    # <state_dir>/tls/, made by the embedded cluster (`make run`) when missing.
    auto: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    client_certs: bool = False        # mutual TLS: servers require a client certificate signed by ca_file

    def files(self, data_dir: str) -> tuple[str, str, str]:
        """(CA, certificate, key) paths: the configured ones, or with `auto`
        those under <state_dir>/tls/."""
        if self.auto and not self.ca_file:
            base = Path(data_dir) / "tls"
            return str(base / "ca.pem"), str(base / "cluster.pem"), str(base / "cluster-key.pem")
        return self.ca_file, self.cert_file, self.key_file


@dataclass(frozen=True)
class AuthConfig:
    # Token auth (docs/operations.md): clients present a token; the role that
    # accepts them checks its rights per domain (produce, consume, admin).
    enabled: bool = False
    # Without files given: <state_dir>/auth/tokens.toml and the cluster token
    # <state_dir>/auth/cluster.token, plus local.token (every right, for the
    # tools on this machine), made by the embedded cluster (`make run`) or
    # `taproot auth init` when missing.
    auto: bool = False
    tokens_file: str = ""             # [[tokens]]: name, sha256, rights, expires (`taproot auth add` writes it)
    cluster_token_file: str = ""      # the token roles present to each other (every right)
    # The token the pipeline's Spark Connect endpoint requires (Spark Connect
    # checks one token, and its SQL reaches every table: give it to data
    # teams, not the cluster token). "": with `auto` <state_dir>/auth/connect.token
    # (made with the others), else the cluster token.
    connect_token_file: str = ""

    def files(self, data_dir: str) -> tuple[str, str]:
        """(tokens file, cluster token file): the configured ones, or with
        `auto` those under <state_dir>/auth/."""
        base = Path(data_dir) / "auth"
        return (self.tokens_file or (str(base / "tokens.toml") if self.auto else ""),
                self.cluster_token_file or (str(base / "cluster.token") if self.auto else ""))

    def connect_file(self, data_dir: str) -> str:
        """The Spark Connect endpoint's token file (`connect_token_file`)."""
        return self.connect_token_file or (str(Path(data_dir) / "auth" / "connect.token") if self.auto
                                           else self.files(data_dir)[1])

    def local_token_file(self, data_dir: str) -> str | None:
        """With `auto`: the every-right token for this machine's tools."""
        return str(Path(data_dir) / "auth" / "local.token") if self.auto else None


@dataclass(frozen=True)
class StorageConfig:
    # An S3-compatible object store, for data_dir = "s3://bucket/prefix"
    # (docs/deploy.md). delta-rs (the nodes) and Spark (the pipeline, over
    # hadoop-aws's s3a) both reach it with these. Credentials: the
    # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables.
    endpoint: str = ""                # e.g. "http://10.0.0.9:8333"; "": AWS S3 itself
    region: str = "us-east-1"
    allow_http: bool = False          # an http:// endpoint (a test server, a private network)
    path_style: bool = True           # the bucket in the path, not the host name (most S3-compatible servers)

    def delta_rs_env(self) -> dict[str, str]:
        """The AWS_* variables delta-rs reads for these settings."""
        env = {"AWS_REGION": self.region, "AWS_ALLOW_HTTP": str(self.allow_http).lower(),
               "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower()}
        if self.endpoint:
            env["AWS_ENDPOINT_URL"] = self.endpoint
        return env

    def spark_conf(self) -> dict[str, str]:
        """Spark's s3a settings for the same store; `s3://` URIs go to s3a too,
        so both engines read one data_dir."""
        conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
                "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
                "spark.hadoop.fs.s3a.endpoint.region": self.region,
                "spark.hadoop.fs.s3a.aws.credentials.provider":
                    "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"}
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        return conf


OBJECT_STORE_SCHEMES = ("s3://", "s3a://")
# `[cluster] state_dir` when unset and the tables are on an object store.
STATE_DIR_FOR_OBJECT_STORE = "taproot-state"


def on_object_store(data_dir: str) -> bool:
    return data_dir.startswith(OBJECT_STORE_SCHEMES)


def use_storage(config: "ClusterConfig") -> None:
    """Give this process's delta-rs the object store's settings (environment
    variables, which every table handle reads); nothing for a local data_dir."""
    if on_object_store(config.data_dir):
        os.environ.update(config.storage.delta_rs_env())


def spark_options(config: "ClusterConfig") -> dict[str, Any]:
    """`storage.spark.session`'s keyword arguments: `[pipeline]`'s Spark
    settings, and for an object store s3a's settings and hadoop-aws."""
    options = config.pipeline.spark_options()
    if on_object_store(config.data_dir):
        options["extra_conf"] = {**config.storage.spark_conf(), **options["extra_conf"]}
        options["object_store"] = True
    return options


@dataclass(frozen=True)
class MetricsConfig:
    # Each queue is a label value of the queue metrics; past this many
    # queues a role reports the rest as queue="_other" (summed).
    max_queue_series: int = 1000


@dataclass(frozen=True)
class MaintenanceConfig:
    # How often the running pipeline removes finished history, compacts and
    # vacuums (pipelines/retention.py); 0: only by hand (`taproot maintain`).
    interval_s: int = 3600
    # Vacuum keeps files younger than this: the furthest a reader (the dedup
    # stream, a time-travel query) may lag behind.
    vacuum_retention_hours: int = 24
    # The delivery log (Spark's) keeps its commit files this long: how far
    # back a time-travel query (`taproot replay --version`) or a stream
    # reading it can start. The partition's primary deletes older ones
    # (`Partition._trim_delivery_log`): Spark's own cleanup only goes back to
    # a midnight, and every refresh of the log on a local disk lists them all.
    delivery_log_retention_minutes: int = 360


@dataclass(frozen=True)
class HaConfig:
    # A partition's primary renews its lease (a Delta commit) this often; when a
    # follower has seen no renewal for lease_duration_ms it takes the partition.
    # Failover takes about lease_duration_ms plus the new primary's recovery.
    lease_duration_ms: int = 2000
    lease_renew_interval_ms: int = 500
    # Graceful stop (SIGTERM, `taproot node stop`): how long a stopping node
    # waits for its peers to stop sending and for consumers to confirm what
    # they hold before it hands its partitions over.
    stop_timeout_ms: int = 10_000
    # Retransmission buffers (SDK, proxies, forwarding nodes): PUTs kept until
    # their ACK. For each queue the time bound is the smaller of this and the
    # domain's dedup_history_window_ms (sent in the OpenQueue response), so a
    # retransmitted PUT never outlives the GUID history that drops duplicates.
    # The defaults are `protocol.retransmit.RetransmissionLimits`'s, the SDK's
    # too; the shipped cluster.toml sets a shorter time bound for the hops.
    retransmission_timeout_ms: int = RetransmissionLimits.timeout_ms
    retransmission_max_messages: int = RetransmissionLimits.max_messages
    retransmission_max_bytes: int = RetransmissionLimits.max_bytes
    # Bytes a node or proxy holds for one client or relay that does not read
    # what it is sent; beyond it that stream is dropped (`protocol/stream.py`).
    link_outbound_max_bytes: int = 256 * 1024 * 1024

    @property
    def retransmission(self) -> RetransmissionLimits:
        return RetransmissionLimits(self.retransmission_max_messages, self.retransmission_max_bytes,
                                    self.retransmission_timeout_ms)


LINK_DIRECTIONS = ("push", "pull")
LINK_FORWARD_MODES = ("all", "unmatched", "none")
HOST_PORT_RE = re.compile(r"^[-a-zA-Z0-9_.:\[\]]+:[0-9]{1,5}$")


@dataclass(frozen=True)
class LinkConfig:
    """A federation link to another Taproot cluster (`[[links]]`,
    docs/federation.md), configured on this side only."""
    name: str
    cluster: str                      # the remote cluster's [cluster] name; routes queue@<cluster>
    hosts: tuple[str, ...] = ()       # its proxies (or nodes), host:port, tried in turn
    domains: tuple[str, ...] = ()     # the local domains it carries, each to the same domain there
    # push: this cluster's messages go there; pull: while a queue of these
    # domains has consumers here, its messages there (matching the consumers'
    # subscriptions) come here.
    direction: str = "push"
    # push links: all: every message of the domains (and delivered here too);
    # unmatched: those no local app subscription takes; none: only
    # queue@<cluster> PUTs. Pull links take no `forward`.
    forward: str = "all"
    batch_messages: int = 5000        # rows read and posted per round
    retry_interval_ms: int = 1000     # after a failed round (the remote down, a refusal)
    token_file: str = ""              # the token the other cluster gave this one ([auth] there); "": none


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "local"
    data_dir: str = "data"            # local path or any URI delta-rs and Spark accept
    # This machine's own files: role logs, pid files and (with `auto`) the TLS
    # and token files. "": the data directory when it is local; with the
    # tables on an object store, STATE_DIR_FOR_OBJECT_STORE (docs/deploy.md).
    state_dir: str = ""
    partitions: int = 1
    nodes: tuple[NodeConfig, ...] = (NodeConfig("node1"),)
    proxies: tuple[ProxyConfig, ...] = (ProxyConfig("proxy1"),)
    primary: PrimaryConfig = PrimaryConfig()
    pipeline: PipelineConfig = PipelineConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    ha: HaConfig = HaConfig()
    metrics: MetricsConfig = MetricsConfig()
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()
    storage: StorageConfig = StorageConfig()
    domains: Mapping[str, "DomainConfig"] = field(default_factory=dict)
    links: tuple[LinkConfig, ...] = ()

    @property
    def local_dir(self) -> str:
        """Where this machine's roles keep their own files (`state_dir`)."""
        if self.state_dir:
            return self.state_dir
        return STATE_DIR_FOR_OBJECT_STORE if on_object_store(self.data_dir) else self.data_dir

    def node(self, name: str) -> NodeConfig:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(f"no node named {name!r}; nodes are {[n.name for n in self.nodes]}")

    @property
    def history_window_ms(self) -> int:
        """The GUID history of a partition, kept by the pipeline's dedup query
        and by the primary's express lane alike: one history serves every
        domain of the partition, so it keeps the longest window (a domain with
        a shorter one gets more dedup, never less)."""
        windows = [d.dedup_history_window_ms for d in self.domains.values()]
        return max(windows) if windows else DEFAULT_HISTORY_WINDOW_MS

    def proxy(self, name: str) -> ProxyConfig:
        for proxy in self.proxies:
            if proxy.name == name:
                return proxy
        raise ConfigError(f"no proxy named {name!r}; proxies are {[p.name for p in self.proxies]}")


@dataclass(frozen=True)
class DomainConfig:
    """One domain (`domains/<name>.toml`). 0 means "no limit" for every limit."""
    name: str
    mode: str = "priority"                   # priority | fanout | broadcast
    # express: the primary pushes right after the PUT commit (its own GUID
    # history and app subscriptions) and reconciles with the pipeline's
    # delivery log; pipeline: nothing is pushed before Spark has decided.
    delivery: str = "express"
    # Fanout: the applications; each gets every message (taproot://d/q?id=<app>).
    app_ids: tuple[str, ...] = ()
    # Application subscriptions: app id -> expression (protocol/expression.py).
    # A message an app's expression does not match is auto-confirmed for that
    # app. In a priority domain the key is "" (BlazingMQ's convention).
    subscriptions: Mapping[str, str] = field(default_factory=dict)
    max_payload_bytes: int = 4 * 1024 * 1024
    dedup_history_window_ms: int = limits.DEDUP_HISTORY_WINDOW_MS
    max_unconfirmed_messages_default: int = limits.MAX_UNCONFIRMED_MESSAGES
    max_unconfirmed_bytes_default: int = limits.MAX_UNCONFIRMED_BYTES
    # Quotas: messages accepted and not yet done (confirmed by every app, dead-
    # lettered or expired). A PUT beyond one gets LIMIT_MESSAGES / LIMIT_BYTES.
    queue_max_messages: int = 0
    queue_max_bytes: int = 0
    domain_max_messages: int = 0
    domain_max_bytes: int = 0
    watermark_percent: int = 80              # a warning alarm fires at this fill level
    max_consumers: int = 0                   # per queue
    max_producers: int = 0                   # per queue
    message_ttl_ms: int = 0                  # not pushed after this long; 0: never expires
    max_delivery_attempts: int = 0           # then dead-lettered; 0: unlimited (BlazingMQ recommends 5)
    # Finished messages (confirmed by every app, or dead-lettered) are removed
    # from the tables once older than this and than the dedup window; 0: keep.
    retention_ms: int = 7 * 24 * 3_600_000

    @property
    def apps(self) -> tuple[str, ...]:
        """The app ids routing works with: the fanout apps, or the single "" app."""
        return self.app_ids if self.mode == "fanout" else ("",)

    @property
    def has_quota(self) -> bool:
        return any((self.queue_max_messages, self.queue_max_bytes, self.domain_max_messages,
                    self.domain_max_bytes))


_INT_RANGES: dict[str, tuple[int, int]] = {
    "port": (0, 65535),
    "http_port": (-1, 65535),
    "connect_port": (-1, 65535),
    "max_queue_series": (0, 1_000_000),
    "partitions": (1, 4096),
    "group_commit_max_messages": (1, 1_000_000),
    "group_commit_max_bytes": (1024, 1 << 31),
    "group_commit_linger_ms": (0, 10_000),
    "group_commit_eager_messages": (1, 1_000_000),
    "group_commit_busy_linger_ms": (0, 10_000),
    "confirm_commit_linger_ms": (0, 10_000),
    "delivery_poll_interval_ms": (1, 60_000),
    "pending_puts_max": (1, 10_000_000),
    "compact_every_commits": (0, 1_000_000),
    "compact_target_file_bytes": (1024 * 1024, 1 << 34),
    # At 0 a trim could delete a log entry between a handle listing the log
    # and reading it: the appender's next fence check then failed ("File not
    # found: .../_delta_log/...json"), measured with commits and trims back to back.
    "log_retention_s": (5, 10 * 365 * 24 * 3600),
    "trigger_interval_ms": (0, 3_600_000),
    "cpu_nice": (0, 19),
    "cpu_full_share_lag_s": (0, 86_400),
    "shuffle_partitions": (1, 1024),
    "max_files_per_trigger": (1, 1_000_000),
    "max_payload_bytes": (1, 64 * 1024 * 1024),
    "dedup_history_window_ms": (1000, 7 * 24 * 3_600_000),
    "max_unconfirmed_messages_default": (0, 10_000_000),
    "max_unconfirmed_bytes_default": (0, 1 << 40),
    "queue_max_messages": (0, 1 << 40),
    "queue_max_bytes": (0, 1 << 50),
    "domain_max_messages": (0, 1 << 40),
    "domain_max_bytes": (0, 1 << 50),
    "watermark_percent": (1, 100),
    "max_consumers": (0, 1_000_000),
    "max_producers": (0, 1_000_000),
    "message_ttl_ms": (0, 365 * 24 * 3_600_000),
    "max_delivery_attempts": (0, 1_000_000),
    "retention_ms": (0, 100 * 365 * 24 * 3_600_000),
    "interval_s": (0, 30 * 24 * 3600),
    "vacuum_retention_hours": (0, 100 * 365 * 24),
    "delivery_log_retention_minutes": (1, 100 * 365 * 24 * 60),
    "lease_duration_ms": (200, 600_000),
    "lease_renew_interval_ms": (50, 300_000),
    "stop_timeout_ms": (0, 3_600_000),
    "retransmission_timeout_ms": (1000, 7 * 24 * 3_600_000),
    "retransmission_max_messages": (1, 1 << 40),
    "retransmission_max_bytes": (1024 * 1024, 1 << 50),
    "link_outbound_max_bytes": (1024 * 1024, 1 << 40),
    "batch_messages": (1, 1_000_000),
    "retry_interval_ms": (10, 3_600_000),
}
APP_ID_RE = re.compile(r"^[-a-zA-Z0-9_.~]{1,64}$")


def _build(cls: type, raw: Mapping[str, Any], where: str, **fixed: Any) -> Any:
    """Build frozen dataclass `cls` from `raw`, checking names, types and ranges."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table, got {type(raw).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    values: dict[str, Any] = dict(fixed)
    problems: list[str] = []
    for key, value in raw.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            problems.append(f"{path}: unknown field{_near(str(key), known)}")
            continue
        default = known[key].default
        if isinstance(default, bool) or default is dataclasses.MISSING and known[key].type == "bool":
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            expected = type(default).__name__ if default is not dataclasses.MISSING else "str"
            problems.append(f"{path}: expected {expected}, got {type(value).__name__} {value!r}")
            continue
        if key in _INT_RANGES:
            lo, hi = _INT_RANGES[key]
            if not lo <= value <= hi:
                problems.append(f"{path}: must be between {lo} and {hi}, got {value}")
                continue
        values[key] = value
    missing = [n for n, f in known.items() if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and n not in values and n not in raw]
    if missing:
        problems.append(f"{where or 'top level'}: missing required field(s) {', '.join(missing)}")
    if problems:
        raise ConfigError(problems)
    return cls(**values)


def _near(name: str, known: Iterable[str]) -> str:
    """' (did you mean x?)' for a misspelt name, else the names there are."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"


def parse_domain(name: str, raw: Mapping[str, Any], where: str = "") -> DomainConfig:
    where = where or f"domains/{name}.toml"
    if not DOMAIN_NAME_RE.match(name):
        raise ConfigError(f"{where}: domain name {name!r} must match {DOMAIN_NAME_RE.pattern}")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table")
    raw = dict(raw)
    app_ids = raw.pop("app_ids", [])
    subscriptions = raw.pop("subscriptions", {})
    try:
        domain = _build(DomainConfig, raw, "", name=name) if raw else DomainConfig(name=name)
    except ConfigError as exc:
        raise exc.within(where) from None
    if domain.mode not in QUEUE_MODES:
        raise ConfigError(f"{where}: mode: must be one of {', '.join(QUEUE_MODES)}, got {domain.mode!r}")
    if domain.delivery not in DELIVERY_MODES:
        raise ConfigError(f"{where}: delivery: must be one of {', '.join(DELIVERY_MODES)}, "
                          f"got {domain.delivery!r}")
    if not isinstance(app_ids, list) or not all(isinstance(a, str) for a in app_ids):
        raise ConfigError(f"{where}: app_ids: expected a list of strings, got {app_ids!r}")
    for app in app_ids:
        if not APP_ID_RE.match(app):
            raise ConfigError(f"{where}: app_ids: {app!r} must match {APP_ID_RE.pattern}")
    if len(set(app_ids)) != len(app_ids):
        raise ConfigError(f"{where}: app_ids: duplicate app id(s) "
                          f"{sorted({a for a in app_ids if app_ids.count(a) > 1})}")
    if domain.mode == "fanout" and not app_ids:
        raise ConfigError(f"{where}: app_ids: a fanout domain needs at least one app id")
    if domain.mode != "fanout" and app_ids:
        raise ConfigError(f"{where}: app_ids: only fanout domains have app ids (mode is {domain.mode!r})")
    if not isinstance(subscriptions, Mapping):
        raise ConfigError(f"{where}: subscriptions: expected a table of app id = \"expression\"")
    if subscriptions and domain.mode == "broadcast":
        raise ConfigError(f"{where}: subscriptions: broadcast domains have no application subscriptions "
                          "(consumers can still subscribe)")
    from protocol.expression import ExpressionError, compile_expression  # no Taproot import at load time
    for app, text in subscriptions.items():
        allowed = app_ids if domain.mode == "fanout" else [""]
        if app not in allowed:
            raise ConfigError(f"{where}: subscriptions.{app!r}: not an app of this domain "
                              f"(apps: {allowed!r}; a priority domain uses the key \"\")")
        if not isinstance(text, str):
            raise ConfigError(f"{where}: subscriptions.{app!r}: expected a string, got {text!r}")
        try:
            compile_expression(text)
        except ExpressionError as exc:
            raise ConfigError(f"{where}: subscriptions.{app!r}: {exc}") from None
    if domain.mode == "broadcast":
        for key in ("queue_max_messages", "queue_max_bytes", "domain_max_messages", "domain_max_bytes",
                    "message_ttl_ms", "max_delivery_attempts", "delivery"):
            if getattr(domain, key) and key in raw:
                raise ConfigError(f"{where}: {key}: broadcast domains store nothing, so {key} does not apply")
    return dataclasses.replace(domain, app_ids=tuple(app_ids), subscriptions=dict(subscriptions))


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML; anything that keeps it from being read is a ConfigError."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}{_toml_context(path, str(exc))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a configuration") from None


_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_HINTS = (
    ("Cannot overwrite a value", "a key or [section] given twice: each may appear once per table"),
    ("Cannot declare", "a [section] given twice, or a key and a [section] with one name"),
    ("Unterminated string", "a string without its closing quote"),
    ("Illegal character '\\n'", "a string not closed before the end of its line (a missing quote)"),
    ("Invalid value", "a value TOML does not know: strings need quotes (\"...\"), booleans are true/false"),
    ("Expected '=' after a key", "a key without '= value', or a space inside a bare key (quote it)"),
    ("Invalid statement", "a line that is neither key = value nor [section]"),
)


def _toml_context(path: Path, message: str) -> str:
    """The line tomllib stopped at, a caret under the column, and what the
    usual cause of that error is."""
    at = _TOML_AT.search(message)
    if at is None:
        return ""
    line, column = int(at.group(1)), int(at.group(2))
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()[line - 1]
    except (OSError, IndexError):
        return ""
    hint = next((h for key, h in _TOML_HINTS if key in message), "")
    return (f"\n  {line:>4} | {text}\n       | {' ' * max(0, column - 1)}^"
            + (f"\n  usually: {hint}" if hint else ""))


def _array_of_tables(raw: Any, where: str) -> list[Any] | None:
    if raw is None or isinstance(raw, list):
        return raw
    raise ConfigError(f"{where}: must be an array of tables ([[{where}]] sections), got {type(raw).__name__} "
                      f"{raw!r}")


def parse_cluster(raw: Mapping[str, Any], domains: Mapping[str, DomainConfig]) -> ClusterConfig:
    """`cluster.toml`'s contents; a ConfigError lists every problem found."""
    raw = dict(raw)
    found = _Problems()
    top: dict[str, Any] = {}
    cluster_raw = raw.pop("cluster", {})
    nodes_raw = found.check(lambda: _array_of_tables(raw.pop("nodes", None), "nodes"))
    proxies_raw = found.check(lambda: _array_of_tables(raw.pop("proxies", None), "proxies"))
    sections_raw = {name: raw.pop(name, {}) for name in ("primary", "pipeline", "maintenance", "ha", "metrics",
                                                         "tls", "auth", "storage")}
    links_raw = found.check(lambda: _array_of_tables(raw.pop("links", None), "links"))
    for name in raw:
        found.found.append(f"{name}: unknown section{_near(name, SECTIONS)}")
    # Sections have their own tables: `[cluster] ha = "x"` is an unknown field, not silently dropped.
    sections = dict(nodes=(), proxies=(), primary=PrimaryConfig(), pipeline=PipelineConfig(),
                    maintenance=MaintenanceConfig(), ha=HaConfig(), metrics=MetricsConfig(), tls=TlsConfig(),
                    auth=AuthConfig(), storage=StorageConfig(), domains={})
    base = found.check(lambda: _build(ClusterConfig, cluster_raw, "cluster", links=(), **sections),
                       ClusterConfig())
    if not CLUSTER_RE.match(base.name):
        found.found.append(f"cluster.name: must match {CLUSTER_RE.pattern} (it names the cluster in "
                           f"queue@cluster), got {base.name!r}")
    top.update({f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                if f.name not in sections and f.name != "links"})
    nodes = tuple(n for n in (found.check(functools.partial(_build, NodeConfig, n, f"nodes[{i}]"))
                              for i, n in enumerate(nodes_raw or [{"name": "node1"}])) if n is not None)
    proxies = tuple(p for p in (found.check(functools.partial(_build, ProxyConfig, p, f"proxies[{i}]"))
                                for i, p in enumerate(proxies_raw or [])) if p is not None)
    names = [n.name for n in nodes] + [p.name for p in proxies]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        found.found.append(f"nodes/proxies: duplicate name(s) {sorted(dupes)}")
    for i, proxy in enumerate(proxies):
        if proxy.upstream and proxy.upstream not in {n.name for n in nodes}:
            found.found.append(f"proxies[{i}].upstream: no node named {proxy.upstream!r}")
    built = {name: found.check(functools.partial(_build, cls, sections_raw[name], name), cls())
             for name, cls in (("primary", PrimaryConfig), ("pipeline", PipelineConfig),
                               ("maintenance", MaintenanceConfig), ("ha", HaConfig), ("metrics", MetricsConfig),
                               ("tls", TlsConfig), ("auth", AuthConfig), ("storage", StorageConfig))}
    primary, ha, tls, auth = built["primary"], built["ha"], built["tls"], built["auth"]
    if primary.durability not in DURABILITY_MODES:
        found.found.append(f"primary.durability: must be one of {', '.join(DURABILITY_MODES)}, "
                           f"got {primary.durability!r}")
    if ha.lease_renew_interval_ms * 2 > ha.lease_duration_ms:
        found.found.append(f"ha.lease_renew_interval_ms: must be at most half of ha.lease_duration_ms "
                           f"({ha.lease_duration_ms}), got {ha.lease_renew_interval_ms}")
    links = found.check(lambda: parse_links(links_raw or [], base.name, domains), ())
    if tls.enabled and not tls.auto:
        unset = [f"tls.{f}" for f in ("ca_file", "cert_file", "key_file") if not getattr(tls, f)]
        if unset:
            found.found.append(f"{unset[0]}: TLS is enabled without auto: set {', '.join(unset)}")
    if tls.client_certs and not tls.enabled:
        found.found.append("tls.client_certs: mutual TLS needs tls.enabled = true")
    if auth.enabled and not auth.auto:
        unset = [f"auth.{f}" for f in ("tokens_file", "cluster_token_file") if not getattr(auth, f)]
        if unset:
            found.found.append(f"{unset[0]}: auth is enabled without auto: set {', '.join(unset)}")
    pipeline = built["pipeline"]
    if pipeline.connect_port != -1 and not auth.enabled and not _loopback(pipeline.connect_host):
        found.found.append(f"pipeline.connect_host: {pipeline.connect_host!r} is not a loopback address, and "
                           "with [auth] off Spark Connect would serve every table's SQL to anyone who reaches "
                           "it: keep 127.0.0.1, turn [auth] on (the endpoint then requires a token) or set "
                           "connect_port = -1")
    found.raise_any()
    return ClusterConfig(**top, nodes=nodes, proxies=proxies, primary=primary, pipeline=built["pipeline"],
                         maintenance=built["maintenance"], ha=ha, metrics=built["metrics"], tls=tls, auth=auth,
                         domains=dict(domains), storage=built["storage"], links=links)


def _loopback(host: str) -> bool:
    import ipaddress
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


SECTIONS = ("cluster", "nodes", "proxies", "primary", "pipeline", "maintenance", "ha", "metrics", "tls", "auth",
            "storage", "links")


def _string_list(raw: Any, where: str, pattern: "re.Pattern[str]", what: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
        raise ConfigError(f"{where}: must be a non-empty list of {what}, got {raw!r}")
    for value in raw:
        if not pattern.match(value):
            raise ConfigError(f"{where}: {value!r} is not a {what} (must match {pattern.pattern})")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"{where}: lists {what}s more than once: {raw!r}")
    return tuple(raw)


def parse_links(raw: list[Any], cluster: str, domains: Mapping[str, "DomainConfig"]) -> tuple[LinkConfig, ...]:
    """`[[links]]`: each names the remote cluster, its hosts and the local
    domains it carries. Two links may not route the same domain to one cluster."""
    links: list[LinkConfig] = []
    routes: dict[tuple[str, str, str], str] = {}
    for i, entry in enumerate(raw):
        where = f"links[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: must be a table, got {type(entry).__name__}")
        entry = dict(entry)
        hosts = _string_list(entry.pop("hosts", None), f"{where}.hosts", HOST_PORT_RE, "host:port")
        carried = _string_list(entry.pop("domains", None), f"{where}.domains", DOMAIN_RE, "domain name")
        link = _build(LinkConfig, entry, where, hosts=hosts, domains=carried)
        if not APP_ID_RE.match(link.name):
            raise ConfigError(f"{where}.name: must match {APP_ID_RE.pattern}, got {link.name!r}")
        if not CLUSTER_RE.match(link.cluster):
            raise ConfigError(f"{where}.cluster: must match {CLUSTER_RE.pattern}, got {link.cluster!r}")
        if link.cluster == cluster:
            raise ConfigError(f"{where}.cluster: {link.cluster!r} is this cluster's own name")
        if link.direction not in LINK_DIRECTIONS:
            raise ConfigError(f"{where}.direction: must be one of {', '.join(LINK_DIRECTIONS)}, got "
                              f"{link.direction!r}")
        if link.forward not in LINK_FORWARD_MODES:
            raise ConfigError(f"{where}.forward: must be one of {', '.join(LINK_FORWARD_MODES)}, got "
                              f"{link.forward!r}")
        if link.direction == "pull" and "forward" in entry:
            raise ConfigError(f"{where}.forward: a pull link takes what its local consumers subscribe to; "
                              "forward is for push links")
        for name in link.domains:
            domain = domains.get(name)
            if domain is None:
                raise ConfigError(f"{where}.domains: no domain {name!r} (domains: {', '.join(sorted(domains))})")
            if domain.mode == "broadcast":
                raise ConfigError(f"{where}.domains: {name!r} is a broadcast domain, whose messages are not "
                                  "stored: a link cannot carry them")
            other = routes.setdefault((name, link.cluster, link.direction), link.name)
            if other != link.name:
                way = "to" if link.direction == "push" else "from"
                raise ConfigError(f"{where}: links {other!r} and {link.name!r} both {link.direction} domain "
                                  f"{name!r} {way} cluster {link.cluster!r}")
        if any(link.name == other.name for other in links):
            raise ConfigError(f"{where}.name: another link is named {link.name!r}")
        links.append(link)
    return tuple(links)


def domains_dir(cluster_file: str | Path | None = None) -> Path:
    return (Path(cluster_file) if cluster_file else DEFAULT_CLUSTER_FILE).parent / "domains"


def domain_files(directory: Path) -> dict[Path, float | None]:
    """The domain files and their modification times (what a reload watches);
    None for one that cannot be looked at (a dangling link, a link loop), which
    `load_domains` then refuses with the reason."""
    if not directory.is_dir():
        return {}
    files: dict[Path, float | None] = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            files[path] = path.stat().st_mtime
        except OSError:
            files[path] = None
    return files


def load_domains(directory: Path, found: "_Problems | None" = None) -> dict[str, DomainConfig]:
    """Every domain file of `directory`; a ConfigError lists the problems of
    all of them (with `found`, they are added there and the good files are
    returned)."""
    collect = found or _Problems()
    domains: dict[str, DomainConfig] = {}
    for domain_file in domain_files(directory):
        try:
            domains[domain_file.stem] = parse_domain(domain_file.stem, _read_toml(domain_file),
                                                     where=str(domain_file))
        except ConfigError as exc:
            collect.found.extend(exc.within(str(domain_file)).problems)
    if found is None:
        collect.raise_any()
    return domains


def load(path: str | Path | None = None, *, data_dir: str | None = None,
         state_dir: str | None = None) -> ClusterConfig:
    """Load `cluster.toml` and the `domains/*.toml` beside it; `data_dir`
    and `state_dir` override the file's."""
    path = Path(path) if path else DEFAULT_CLUSTER_FILE
    if path.is_dir():                     # the directory that holds cluster.toml and domains/
        if not (path / "cluster.toml").is_file():
            raise ConfigError(f"{path}: is a directory, not a TOML file, and holds no cluster.toml")
        path = path / "cluster.toml"
    found = _Problems()
    raw = _read_toml(path)
    domains = load_domains(domains_dir(path), found)
    try:
        config = parse_cluster(raw, domains)
    except ConfigError as exc:
        found.found[:0] = exc.within(str(path)).problems
    found.raise_any()
    if data_dir is not None:
        config = dataclasses.replace(config, data_dir=data_dir)
    if state_dir is not None:
        config = dataclasses.replace(config, state_dir=state_dir)
    return config


def server_tls(config: ClusterConfig) -> "ServerTls | None":
    """A serving role's TLS (None: plaintext); a file that cannot be used is
    a ConfigError naming it."""
    from protocol.tls import ServerTls, TlsError
    if not config.tls.enabled:
        return None
    ca, cert, key = config.tls.files(config.local_dir)
    try:
        return ServerTls.from_files(ca, cert, key, config.tls.client_certs)
    except TlsError as exc:
        hint = " (the embedded cluster makes them: `taproot run`, or `taproot tls init`)" if config.tls.auto else ""
        raise ConfigError(f"tls: {exc}{hint}") from None


def client_tls(config: ClusterConfig) -> "ClientTls | None":
    """What a client of this cluster presents (None: plaintext): the CA and,
    with mutual TLS, the cluster's certificate."""
    from protocol.tls import ClientTls, TlsError
    if not config.tls.enabled:
        return None
    ca, cert, key = config.tls.files(config.local_dir)
    try:
        return ClientTls.from_files(ca, cert, key) if config.tls.client_certs else ClientTls.from_files(ca)
    except TlsError as exc:
        raise ConfigError(f"tls: {exc}") from None


def authenticator(config: ClusterConfig) -> "Authenticator | None":
    """What a serving role checks tokens with (None: [auth] off); a tokens
    or cluster token file that cannot be used is a ConfigError naming it."""
    from protocol.auth import Authenticator, AuthError, TokenStore, token_hash
    if not config.auth.enabled:
        return None
    tokens, _ = config.auth.files(config.local_dir)
    try:
        return Authenticator(TokenStore(tokens, token_hash(_cluster_token(config))))
    except AuthError as exc:
        raise ConfigError(f"auth: {exc}{_AUTO_HINT if config.auth.auto else ''}") from None


_AUTO_HINT = " (the embedded cluster makes them: `taproot run`, or `taproot auth init`)"


def _cluster_token(config: ClusterConfig) -> str:
    from protocol.auth import read_token_file
    return read_token_file(config.auth.files(config.local_dir)[1])


def cluster_token(config: ClusterConfig) -> str | None:
    """The token this cluster's roles present to each other (None: [auth] off)."""
    from protocol.auth import AuthError
    if not config.auth.enabled:
        return None
    try:
        return _cluster_token(config)
    except AuthError as exc:
        raise ConfigError(f"auth: {exc}{_AUTO_HINT if config.auth.auto else ''}") from None


def client_token(config: ClusterConfig) -> str | None:
    """The token a tool run by hand presents: TAPROOT_TOKEN (or the file
    TAPROOT_TOKEN_FILE names); else, with [auth] auto, this machine's
    local.token when it exists; else none (a cluster with [auth] on then
    refuses, saying a token is needed)."""
    from protocol.auth import AuthError, read_token_file, token_from_env
    try:
        token = token_from_env()
        local = config.auth.local_token_file(config.local_dir) if config.auth.enabled else None
        if token is None and local and os.path.exists(local):
            token = read_token_file(local)
    except AuthError as exc:
        raise ConfigError(f"auth: {exc}") from None
    return token


CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"   # what pyspark's Connect client reads too


def connect_token(config: ClusterConfig, serving: bool = False) -> str | None:
    """The token of the pipeline's Spark Connect endpoint, with [auth] on
    (`[auth] connect_token_file`). Serving, a file that cannot be read is a
    ConfigError naming it; as a client (`taproot sql`, `replay`), the
    SPARK_CONNECT_AUTHENTICATE_TOKEN variable comes first, and a file this
    user cannot read is no token (the endpoint then says one is needed)."""
    from protocol.auth import AuthError, read_token_file
    if not serving and os.environ.get(CONNECT_TOKEN_ENV):
        return os.environ[CONNECT_TOKEN_ENV].strip()
    if not config.auth.enabled:
        return None
    try:
        return read_token_file(config.auth.connect_file(config.local_dir))
    except AuthError as exc:
        if serving:
            raise ConfigError(f"auth: {exc}{_AUTO_HINT if config.auth.auto else ''}") from None
        return None


def connect_url(config: ClusterConfig) -> str | None:
    """The configured Spark Connect endpoint (`[pipeline] connect_port`), if it has a fixed port."""
    port = config.pipeline.connect_port
    host = config.pipeline.connect_host
    return f"sc://{f'[{host}]' if ':' in host else host}:{port}" if port > 0 else None


def with_connect_token(url: str, token: str | None) -> str:
    """`url` for pyspark's Connect client, bearing `token` (when there is one
    and the URL names none). PySpark's client sends a token over TLS, or over
    a plain local connection when the host is literally "localhost"; the
    endpoint serves no TLS, so a loopback address becomes localhost. The
    result holds the token: never print it."""
    if token is None or ";token=" in url:
        return url
    host_port, _, params = url.removeprefix("sc://").partition("/")
    for loopback in ("127.0.0.1:", "[::1]:"):
        if host_port.startswith(loopback):
            host_port = "localhost:" + host_port[len(loopback):]
    return f"sc://{host_port}/{params};token={token}"


def link_token(link: LinkConfig) -> str | None:
    """The token a federation link presents: its `token_file`'s (issued by
    the other cluster), or none; a file that cannot be read is a ConfigError."""
    from protocol.auth import AuthError, read_token_file
    try:
        return read_token_file(link.token_file) if link.token_file else None
    except AuthError as exc:
        raise ConfigError(f"links {link.name!r}: {exc}") from None


def link_tokens(config: ClusterConfig) -> dict[str, str | None]:
    """What each federation link's session presents, by link name, and under
    "" this cluster's own token, for the sessions a node opens to itself."""
    return {"": cluster_token(config), **{link.name: link_token(link) for link in config.links}}


def client_access(config: ClusterConfig) -> dict[str, Any]:
    """A client's `tls` and `token` (a `Session`'s, `taproot admin`'s), as
    `client_tls` and `client_token` find them."""
    return {"tls": client_tls(config), "token": client_token(config)}
