"""Queue URIs: `taproot://<domain>/<queue>[@<cluster>][?id=<appId>]` (BlazingMQ's
form and limits; `@<cluster>` is OpenAMQ's global routing, docs/federation.md:
the queue of that name on that cluster, reached over a federation link)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

SCHEME = "taproot"
DOMAIN_RE = re.compile(r"^[-a-zA-Z0-9._]+$")
QUEUE_RE = re.compile(r"^[-a-zA-Z0-9_~.]+$")
QUEUE_NAME_MAX_LENGTH = 64
APP_ID_RE = re.compile(r"^[-a-zA-Z0-9_.]+$")
CLUSTER_RE = re.compile(r"^[-a-zA-Z0-9_.]{1,64}$")   # a cluster's name ([cluster] name), as in queue@cluster


@dataclass(frozen=True)
class QueueUri:
    domain: str
    queue: str
    app_id: str = ""

    @property
    def canonical(self) -> str:
        """The queue's identity, without the appId: `taproot://domain/queue`."""
        return f"{SCHEME}://{self.domain}/{self.queue}"

    def __str__(self) -> str:
        return self.canonical + (f"?id={self.app_id}" if self.app_id else "")

    @property
    def cluster(self) -> str:
        """The cluster a `queue@cluster` name routes to; "" for a local queue."""
        return self.queue.partition("@")[2]

    @property
    def local_name(self) -> str:
        """The queue's name on its own cluster (without `@cluster`)."""
        return self.queue.partition("@")[0]

    def on(self, cluster: str) -> "QueueUri":
        """The URI as seen on `cluster`: `queue@cluster` there is plain `queue`."""
        return QueueUri(self.domain, self.local_name, self.app_id) if self.cluster and self.cluster == cluster else self


def partition_of(uri: QueueUri, partitions: int) -> int:
    """Stable queue -> storage partition mapping (crc32 of the canonical URI):
    every node, the pipelines and replay agree on it."""
    return zlib.crc32(uri.canonical.encode()) % partitions


def parse_queue_uri(text: str) -> QueueUri | str:
    """Return the parsed URI, or a reason string saying why `text` is not one."""
    if not isinstance(text, str) or not text:
        return "queue URI is empty"
    if len(text) > 1024:
        return "queue URI longer than 1024 characters"
    parts = urlsplit(text)
    if parts.scheme != SCHEME:
        return f"queue URI {text!r} must start with '{SCHEME}://'"
    domain = parts.netloc
    if not domain or not DOMAIN_RE.match(domain):
        return f"queue URI {text!r}: domain must match {DOMAIN_RE.pattern}"
    queue = parts.path[1:] if parts.path.startswith("/") else parts.path
    name, at, cluster = queue.partition("@")
    if not name or not QUEUE_RE.match(name):
        return f"queue URI {text!r}: queue name must match {QUEUE_RE.pattern}"
    if len(name) > QUEUE_NAME_MAX_LENGTH:
        return f"queue URI {text!r}: queue name longer than {QUEUE_NAME_MAX_LENGTH} characters"
    if at and not CLUSTER_RE.match(cluster):
        return f"queue URI {text!r}: the cluster after '@' must match {CLUSTER_RE.pattern}"
    if parts.fragment:
        return f"queue URI {text!r}: fragments are not allowed"
    app_id = ""
    if parts.query:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = set(query) - {"id"}
        if unknown:
            return f"queue URI {text!r}: unknown option(s) {', '.join(sorted(unknown))}"
        values = query.get("id", [])
        if len(values) != 1 or not APP_ID_RE.match(values[0]):
            return f"queue URI {text!r}: id must be one appId matching {APP_ID_RE.pattern}"
        app_id = values[0]
    return QueueUri(domain, queue, app_id)
