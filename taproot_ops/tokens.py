"""`taproot auth`: the tokens file of a cluster with `[auth]` on
(docs/operations.md). `add` makes a token, prints it once and keeps only its
SHA-256; `revoke` removes one (running roles read the file again within a
second); `list` shows names, rights and expiry; `init` makes the `[auth]
auto` files (the embedded cluster does it itself at its first start)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

import conf
from protocol.auth import RIGHTS, AuthError, TokenEntry, dump_tokens, load_tokens, new_token, token_hash
from protocol.uri import DOMAIN_RE

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_SPAN = re.compile(r"^([0-9]+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (mode 0600), atomically: a role reading the
    file meanwhile sees the old one or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _read(path: Path) -> list[TokenEntry]:
    return list(load_tokens(path).values()) if path.exists() else []


def add(path: Path, name: str, *, produce: Sequence[str] = (), consume: Sequence[str] = (),
        admin: Sequence[str] = (), expires: float | None = None) -> str:
    """A new token named `name` with these rights (domains, "*": every one);
    its hash goes into `path`. The token is returned, and kept nowhere."""
    if not NAME_RE.match(name):
        raise AuthError(f"token name {name!r}: must match {NAME_RE.pattern}")
    entries = _read(path)
    if any(e.name == name for e in entries):
        raise AuthError(f"token name {name!r}: already in {path} (revoke it first)")
    for right, domains in (("produce", produce), ("consume", consume), ("admin", admin)):
        for domain in domains:
            if domain != "*" and not DOMAIN_RE.match(domain):
                raise AuthError(f"--{right} {domain!r}: not a domain name (must match {DOMAIN_RE.pattern}, "
                                "or \"*\" for every domain)")
    token = new_token()
    entries.append(TokenEntry(name, token_hash(token), frozenset(produce), frozenset(consume), frozenset(admin),
                              expires))
    _write_private(path, dump_tokens(entries))
    return token


def revoke(path: Path, name: str) -> bool:
    entries = _read(path)
    kept = [e for e in entries if e.name != name]
    if len(kept) == len(entries):
        return False
    _write_private(path, dump_tokens(kept))
    return True


def init(config: conf.ClusterConfig) -> bool:
    """With `[auth] enabled` and `auto`, make what is missing of
    <state_dir>/auth: the cluster token, a `local` token with every right
    (local.token, for the tools on this machine) in tokens.toml, and the
    Spark Connect endpoint's token (connect.token). True if anything was made."""
    auth = config.auth
    if not (auth.enabled and auth.auto):
        return False
    tokens_file, cluster_file = (Path(p) for p in auth.files(config.local_dir))
    local_file = Path(auth.local_token_file(config.local_dir) or "")
    made = False
    if not auth.cluster_token_file and not cluster_file.exists():
        _write_private(cluster_file, new_token() + "\n")
        made = True
    if not auth.tokens_file and not (tokens_file.exists() and local_file.exists()):
        revoke(tokens_file, "local")
        token = add(tokens_file, "local", produce=["*"], consume=["*"], admin=["*"])
        _write_private(local_file, token + "\n")
        made = True
    connect_file = Path(auth.connect_file(config.local_dir))
    if not auth.connect_token_file and not connect_file.exists():
        _write_private(connect_file, new_token() + "\n")
        made = True
    return made


def parse_expires(text: str, now: float) -> float:
    """`30d`, `12h`, `90m`, `45s` from now, or an ISO date-time (UTC unless it says)."""
    span = _SPAN.match(text)
    if span:
        return now + int(span.group(1)) * _UNIT_S[span.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise AuthError(f"--expires {text!r}: give a span (30d, 12h, 90m, 45s) or an ISO date-time "
                        "(2027-01-31T00:00:00Z)") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def _tokens_path(config: conf.ClusterConfig) -> Path:
    tokens_file, _ = config.auth.files(config.local_dir)
    if not config.auth.enabled or not tokens_file:
        raise AuthError("this cluster's [auth] is off (enabled = false): it takes no tokens")
    return Path(tokens_file)


def _domains(values: list[str] | None) -> list[str]:
    return [d.strip() for value in values or [] for d in value.split(",") if d.strip()]


def cmd_auth(args: argparse.Namespace) -> int:
    import time
    try:
        config = conf.load(args.config, data_dir=args.data_dir)
        if args.action == "init":
            if not (config.auth.enabled and config.auth.auto):
                print("auth init: this cluster's [auth] does not use auto files (enabled = true, auto = true)",
                      file=sys.stderr)
                return 2
            made = init(config)
            tokens_file, cluster_file = config.auth.files(config.local_dir)
            print(("made" if made else "kept (they exist)") + f": {tokens_file}, {cluster_file}, "
                  f"{config.auth.local_token_file(config.local_dir)}, {config.auth.connect_file(config.local_dir)}")
            return 0
        path = _tokens_path(config)
        if args.action == "add":
            if not args.name:
                raise AuthError("auth add: name the token (taproot auth add NAME --produce D ...)")
            rights = {r: _domains(getattr(args, r)) for r in RIGHTS}
            if not any(rights.values()):
                raise AuthError("auth add: give at least one right: --produce, --consume or --admin DOMAIN[,...]")
            expires = parse_expires(args.expires, time.time()) if args.expires else None
            token = add(path, args.name, expires=expires, **rights)
            print(token)   # the only place the token is ever written: give it to its user now
            print(f"added {args.name!r} to {path} (only its SHA-256 is kept)", file=sys.stderr)
            return 0
        if args.action == "revoke":
            if not args.name:
                raise AuthError("auth revoke: name the token")
            if not revoke(path, args.name):
                print(f"auth revoke: no token named {args.name!r} in {path}", file=sys.stderr)
                return 1
            print(f"revoked {args.name!r}: running roles refuse new opens with it within a second and cut "
                  "its sessions off within about two")
            return 0
        rows = [e.describe() for e in _read(path)]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                granted = "; ".join(f"{r} {','.join(row[r])}" for r in RIGHTS if row[r]) or "no rights"
                print(f"{row['name']:24} {granted}" + (f"  (expires {row['expires']})" if row["expires"] else ""))
        return 0
    except (AuthError, conf.ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser("auth", help="tokens for [auth]: add NAME --produce/--consume/--admin D, revoke, list, init")
    p.add_argument("action", choices=["add", "revoke", "list", "init"])
    p.add_argument("name", nargs="?", help="the token's name (add, revoke)")
    for right in RIGHTS:
        p.add_argument(f"--{right}", action="append", metavar="DOMAIN[,...]",
                       help=f"domains the token may {right} (\"*\": every one" +
                       ("; \"*\" also grants the cluster-wide admin commands)" if right == "admin" else ")"))
    p.add_argument("--expires", help="when it stops working: 30d, 12h, 90m, or 2027-01-31T00:00:00Z")
    p.add_argument("--json", action="store_true", help="list: as JSON")
    p.add_argument("--config", help="cluster.toml (default: the shipped one)")
    p.add_argument("--data-dir", help="override cluster.data_dir (where [auth] auto keeps its files)")
    p.set_defaults(func=cmd_auth)
