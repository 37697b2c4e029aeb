"""Token auth (`[auth]` in cluster.toml, docs/operations.md).

A client presents a bearer token in its call metadata (`authorization:
Bearer <token>`); the role that accepts the client (a proxy, or a node a
client reaches directly) checks it when a queue is opened and on every admin
command. A token carries rights per domain: `produce` (open for writing),
`consume` (open for reading), `admin` (the admin API; `"*"` for the
cluster-wide commands). Servers keep only SHA-256 hashes of tokens (tokens
are 256 random bits, so a fast hash is enough); a token is never logged.

Roles talk to each other with the cluster token, which holds every right
(a proxy checked its client before it relays the open). The tokens file is
read again when it changes: a revoked token opens nothing more, and a link
whose token was revoked or has expired is dropped within about two
seconds (the link looks again each second, and the file is read again at
most each second); the client's reconnect then meets the refusal, with its
code.

This module is imported by the SDK too (`token_from_env`, `metadata`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import tomllib

from protocol import taproot_pb2 as pb
from protocol.codes import ResultCode, status
from protocol.uri import parse_queue_uri

log = logging.getLogger(__name__)

RIGHTS = ("produce", "consume", "admin")
ALL = "*"                                   # every domain (and, for admin, the cluster-wide commands)
METADATA_KEY = "authorization"
ENV_TOKEN, ENV_TOKEN_FILE = "TAPROOT_TOKEN", "TAPROOT_TOKEN_FILE"
TOKEN_PREFIX = "tpk_"
RECHECK_S = 1.0                             # how often a link's token is looked up again (revocation)
MALFORMED = "malformed"                     # `presented`: an authorization value that is not "Bearer <token>"


class AuthError(ValueError):
    """A tokens file or token file that cannot be used; the message names
    the file and never a token."""


def new_token() -> str:
    """A fresh token: 256 random bits."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents `token` (none without one). A token
    gRPC cannot carry (not printable ASCII, or with spaces) is refused here,
    not on a thread of the stream."""
    if not token:
        return ()
    if not token.isascii() or not token.isprintable() or " " in token:
        raise AuthError("a token is printable ASCII without spaces (`taproot auth add` makes them)")
    return ((METADATA_KEY, f"Bearer {token}"),)


def read_token_file(path: str | Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise AuthError(f"token file {path}: cannot be read: {exc.strerror or exc}") from None
    if not token or any(c.isspace() for c in token):
        raise AuthError(f"token file {path}: must hold one token (one line, no spaces)")
    return token


def token_from_env() -> str | None:
    """TAPROOT_TOKEN, or the token in the file TAPROOT_TOKEN_FILE names; None
    when neither is set: how a `Session` made without `token` finds one."""
    token = os.environ.get(ENV_TOKEN)
    if token:
        return token.strip()
    path = os.environ.get(ENV_TOKEN_FILE)
    return read_token_file(path) if path else None


def presented(call_metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The hash of the token a call presents (None: it presents none). Only
    the hash is kept, so no link, log line or traceback holds the token."""
    for key, value in call_metadata or ():
        if key == METADATA_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            return token_hash(token.strip()) if scheme.lower() == "bearer" and token.strip() else MALFORMED
    return None


@dataclass(frozen=True)
class TokenEntry:
    name: str
    hash: str
    produce: frozenset[str] = frozenset()
    consume: frozenset[str] = frozenset()
    admin: frozenset[str] = frozenset()
    expires: float | None = None            # unix seconds; None: never
    cluster: bool = False                   # the cluster token: every right

    def allows(self, right: str, domain: str) -> bool:
        """`domain` "*": the cluster-wide form of the right (only a "*" grant has it)."""
        if self.cluster:
            return True
        granted: frozenset[str] = getattr(self, right)
        return ALL in granted or domain in granted

    def describe(self) -> dict[str, Any]:
        """What `taproot auth list` shows (no hash)."""
        return {"name": self.name, **{r: sorted(getattr(self, r)) for r in RIGHTS},
                "expires": _iso(self.expires) if self.expires is not None else None}


def _iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _domains(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(d, str) and d for d in value):
        raise AuthError(f"{where}: must be a list of domain names (\"*\": every domain)")
    return frozenset(value)


def parse_tokens(raw: Mapping[str, Any], where: str) -> dict[str, TokenEntry]:
    """A tokens file's `[[tokens]]`, by hash."""
    unknown = set(raw) - {"tokens"}
    if unknown:
        raise AuthError(f"{where}: unknown section {sorted(unknown)[0]!r} (known: tokens)")
    items = raw.get("tokens", [])
    if not isinstance(items, list):
        raise AuthError(f"{where}: tokens must be an array of tables ([[tokens]])")
    entries: dict[str, TokenEntry] = {}
    names: set[str] = set()
    for i, item in enumerate(items):
        at = f"{where}: tokens[{i}]"
        if not isinstance(item, dict):
            raise AuthError(f"{at}: must be a table")
        extra = set(item) - {"name", "sha256", "expires", *RIGHTS}
        if extra:
            raise AuthError(f"{at}: unknown field {sorted(extra)[0]!r} "
                            f"(known: name, sha256, expires, {', '.join(RIGHTS)})")
        name, digest = item.get("name"), item.get("sha256")
        if not isinstance(name, str) or not name:
            raise AuthError(f"{at}.name: must be a non-empty string")
        if name in names:
            raise AuthError(f"{at}.name: {name!r} is used twice")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise AuthError(f"{at}.sha256: must be the token's SHA-256, 64 lowercase hex digits "
                            "(`taproot auth add` writes it)")
        expires = item.get("expires")
        if isinstance(expires, dt.datetime):
            when: float | None = (expires if expires.tzinfo else expires.replace(tzinfo=dt.timezone.utc)).timestamp()
        elif expires is None:
            when = None
        else:
            raise AuthError(f"{at}.expires: must be a TOML date-time (2027-01-31T00:00:00Z)")
        produce, consume, admin = (_domains(item.get(r, []), f"{at}.{r}") for r in RIGHTS)
        names.add(name)
        entries["sha256:" + digest] = TokenEntry(name, "sha256:" + digest, produce, consume, admin, when)
    return entries


def dump_tokens(entries: Sequence[TokenEntry]) -> str:
    """A tokens file holding `entries` (what `taproot auth add/revoke` write)."""
    lines = ["# Taproot tokens (docs/operations.md): SHA-256 hashes only; `taproot auth add NAME ...` adds one.", ""]
    for entry in entries:
        lines += ["[[tokens]]", f"name = {_quote(entry.name)}", f"sha256 = \"{entry.hash.removeprefix('sha256:')}\""]
        if entry.expires is not None:
            lines.append(f"expires = {_iso(entry.expires)}")
        for right in RIGHTS:
            granted = sorted(getattr(entry, right))
            if granted:
                lines.append(f"{right} = [{', '.join(_quote(d) for d in granted)}]")
        lines.append("")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load_tokens(path: str | Path) -> dict[str, TokenEntry]:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise AuthError(f"tokens file {path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AuthError(f"tokens file {path}: not valid TOML: {exc}") from None
    return parse_tokens(raw, f"tokens file {path}")


class Denied(NamedTuple):
    code: ResultCode
    message: str


@dataclass
class TokenStore:
    """The tokens a role accepts: the tokens file (read again when it
    changes; a file that turns unreadable keeps the last good one, with a
    warning) and the cluster token."""
    path: str
    cluster_hash: str | None = None
    _entries: dict[str, TokenEntry] = field(default_factory=dict)
    _stamp: tuple[int, int, int] | None = None
    _checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._entries = load_tokens(self.path)   # at start an unusable file stops the role
        self._cluster = TokenEntry("cluster", self.cluster_hash or "", cluster=True)
        self._stamp = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _refresh(self, force: bool = False) -> None:
        """Read the file again if it changed: at most once a second, or now
        (`force`: a token it did not know, perhaps just added)."""
        now = time.monotonic()
        if not force and now - self._checked < RECHECK_S:
            return
        with self._lock:
            if not force and now - self._checked < RECHECK_S:
                return
            self._checked = now
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._entries = load_tokens(self.path)
                log.info("auth: tokens file %s read again: %d tokens", self.path, len(self._entries))
            except AuthError as exc:
                log.warning("auth: %s; keeping the %d tokens read before", exc, len(self._entries))

    @property
    def entries(self) -> list[TokenEntry]:
        return list(self._entries.values())

    def lookup(self, digest: str | None) -> TokenEntry | None:
        if digest is None:
            return None
        if self.cluster_hash is not None and hmac.compare_digest(digest, self.cluster_hash):
            return self._cluster
        self._refresh(force=digest not in self._entries)
        return self._entries.get(digest)


class Authenticator:
    """Checks what a presented token (its hash) may do."""

    def __init__(self, store: TokenStore, clock: Any = time.time):
        self.store = store
        self.clock = clock
        self.refusals: dict[str, int] = {}      # by code name: the role's taproot_auth_refusals_total
        self._count_lock = threading.Lock()

    def refused(self, denied: Denied) -> Denied:
        """Count a refusal (`taproot_auth_refusals_total`) and return it."""
        with self._count_lock:
            self.refusals[denied.code.name] = self.refusals.get(denied.code.name, 0) + 1
        return denied

    def entry(self, digest: str | None) -> TokenEntry | Denied:
        """The token's entry, or why it is refused (UNAUTHENTICATED)."""
        verdict = self._entry(digest)
        return self.refused(verdict) if isinstance(verdict, Denied) else verdict

    def _entry(self, digest: str | None) -> TokenEntry | Denied:
        if digest is None:
            return Denied(ResultCode.UNAUTHENTICATED, "this cluster requires a token (Session(token=...) or "
                                                      f"{ENV_TOKEN}/{ENV_TOKEN_FILE}) and none was presented")
        if digest == MALFORMED:
            return Denied(ResultCode.UNAUTHENTICATED, f"the {METADATA_KEY} metadata must be 'Bearer <token>'")
        entry = self.store.lookup(digest)
        if entry is None:
            return Denied(ResultCode.UNAUTHENTICATED, "token not known here (wrong, or revoked)")
        if entry.expires is not None and self.clock() >= entry.expires:
            return Denied(ResultCode.UNAUTHENTICATED, f"token {entry.name!r} expired at {_iso(entry.expires)}")
        return entry

    def check(self, digest: str | None, rights: Iterable[str], domain: str) -> TokenEntry | Denied:
        """The entry when the token holds every one of `rights` on `domain`."""
        entry = self.entry(digest)
        if isinstance(entry, Denied):
            return entry
        for right in rights:
            if not entry.allows(right, domain):
                where = "cluster-wide (admin on \"*\")" if domain == ALL else f"on domain {domain!r}"
                return self.refused(Denied(ResultCode.NOT_AUTHORIZED,
                                            f"token {entry.name!r} lacks the {right} right {where}"))
        return entry


@dataclass
class LinkAuth:
    """What a session stream's link holds about its token: its hash, and
    when to look it up again (revoked or expired: the link is dropped)."""
    digest: str | None
    opened: bool = False           # a queue was opened with it: it is watched from then on
    recheck_at: float = 0.0


def admit(auth: Authenticator, state: LinkAuth, frame: pb.Frame) -> "pb.Frame | str | None":
    """A session frame at the edge: None lets it through; a frame is the
    refusal to send back instead (an OpenQueue without the right); a string
    is why the link must be dropped (its token was revoked or expired)."""
    now = auth.clock()
    if frame.WhichOneof("body") == "open_queue":
        req = frame.open_queue
        uri = parse_queue_uri(req.uri)
        if isinstance(uri, str):
            return None                # the role answers a bad URI (INVALID_ARGUMENT)
        rights = (("consume",) if req.read else ()) + (("produce",) if req.write else ())
        verdict = auth.check(state.digest, rights, uri.domain)
        if isinstance(verdict, Denied):
            return pb.Frame(open_queue_response=pb.OpenQueueResponse(
                request_id=req.request_id, queue_id=req.queue_id, status=status(verdict.code, verdict.message)))
        state.opened, state.recheck_at = True, now + RECHECK_S
    elif state.opened and now >= state.recheck_at:
        state.recheck_at = now + RECHECK_S
        verdict = auth.entry(state.digest)
        if isinstance(verdict, Denied):
            return verdict.message
    return None


def admin_scope(request: pb.AdminRequest) -> str:
    """The domain an admin command needs the admin right on ("*": cluster-wide)."""
    if request.command == "queues" and request.domain:
        return str(request.domain)
    if request.command in ("queue", "purge"):
        uri = parse_queue_uri(request.uri)
        return ALL if isinstance(uri, str) else uri.domain
    return ALL
