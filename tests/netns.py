"""Hosts on this machine: each a Linux network namespace with an address of
its own, all on one bridge that lives in a namespace of its own (the
switch), so traffic flows only between them (nothing reaches the test's
own namespace or the machine's interfaces). A host's link can be cut (its
port on the switch goes down: every packet to and from it is dropped, no
reset is sent) and mended. Needs root and `ip` (iproute2)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.77.0"


class NetworkUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise NetworkUnavailable(f"ip {' '.join(args)}: {out.stderr.strip()}")


@dataclass
class Network:
    """`tag`: a prefix for the namespaces' names, unique on this machine
    (two test runs at once get two networks)."""
    tag: str = field(default_factory=lambda: f"tp{os.getpid() % 100000}")
    hosts: dict[str, int] = field(default_factory=dict)     # host name -> its number on the subnet

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts[host]}"

    def prefix(self, host: str) -> list[str]:
        """The command that runs a process on `host`."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def start(self) -> "Network":
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NetworkUnavailable("network namespaces need root and iproute2's `ip`")
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        return self

    def add(self, host: str, number: int) -> str:
        """A host at 10.77.0.<number>; its address."""
        namespace = self.namespace(host)
        _ip("netns", "add", namespace)
        self.hosts[host] = number
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("link", "add", "eth0", "netns", namespace, "type", "veth",
            "peer", "name", f"port{number}", "netns", self.switch)
        _ip("-n", namespace, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", f"port{number}", "master", "br0")
        _ip("-n", self.switch, "link", "set", f"port{number}", "up")
        return self.address(host)

    def cut(self, host: str) -> None:
        """Drop all of `host`'s traffic, both ways, until `mend`."""
        _ip("-n", self.switch, "link", "set", f"port{self.hosts[host]}", "down")

    def mend(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", f"port{self.hosts[host]}", "up")

    def stop(self) -> None:
        """Delete every namespace (their links go with them). Processes
        still running in one keep it alive, unreachable: stop them first."""
        for namespace in [self.namespace(h) for h in self.hosts] + [self.switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        self.hosts.clear()

    def __enter__(self) -> "Network":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
