"""Leadership and failover: which partitions this node leads, kept through
leases in Delta (`storage.leases`, the Delta I/O; `storage.lease_machine`, the
pure state machine).

A keeper thread takes, renews and gives up every partition's lease. A lease
won is handed to `serve(p, epoch)`, which fences and recovers the partition
(`Partition.start`) and returns it; only then does the partition count as led
here. A lease lost (not renewed in time, or a commit fenced by a newer epoch)
steps the partition down at once through `stepped_down(p, partition)`. After
every round the keeper calls `changed()`, so whoever waits for a partition's
primary (the parked opens of `primary.node`) can look again; nobody sleeps on
a link's reader thread for it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from conf import ClusterConfig
from protocol.clock import wall_time_us
from storage import tables
from storage.lease_machine import Action, LeaseMachine, LeaseState, LeaseView
from storage.leases import Fenced, LeaseTable

if TYPE_CHECKING:
    from primary.partition import Partition

log = logging.getLogger(__name__)


class Where(enum.Enum):
    HERE = "here"                  # this node leads the partition and serves it
    ELSEWHERE = "elsewhere"        # another node leads it, at a known address
    UNKNOWN = "unknown"            # nobody does yet, or this node is taking it over


class Leadership:
    def __init__(self, config: ClusterConfig, name: str, *, serve: Callable[[int, int], "Partition"],
                 stepped_down: Callable[[int, "Partition"], None], changed: Callable[[], None] = lambda: None):
        self.name = name
        self.address = ""
        self.ha = config.ha
        self.partition_count = config.partitions
        self._serve = serve
        self._stepped_down = stepped_down
        self._changed = changed
        names = [n.name for n in config.nodes]
        me = names.index(name) if name in names else 0
        self._machines = [LeaseMachine(name, (me - p) % len(names), self.ha.lease_duration_ms,
                                       self.ha.lease_renew_interval_ms,
                                       ranks={n: (i - p) % len(names) for i, n in enumerate(names)})
                          for p in range(config.partitions)]
        self._tables = [LeaseTable(tables.PartitionPaths(config.data_dir, p).lease) for p in range(config.partitions)]
        self._views: list[LeaseView | None] = [None] * config.partitions
        self.partitions: dict[int, "Partition"] = {}   # led and serving
        self._lock = threading.Lock()                  # the machines and tables
        self._stopping = threading.Event()
        self._keeper = threading.Thread(target=self._keep_leases, name="lease-keeper", daemon=True)

    def start(self, address: str) -> None:
        self.address = address
        self._keeper.start()

    # -- where each partition is led -----------------------------------------------
    def view(self, p: int) -> LeaseView | None:
        """The last read of partition p's lease (its holder, epoch, address)."""
        return self._views[p]

    def where(self, p: int) -> Where:
        if p in self.partitions:
            return Where.HERE
        if self._machines[p].state in (LeaseState.PRIMARY, LeaseState.ACQUIRING):
            return Where.UNKNOWN  # taking it over: recovery first
        return Where.ELSEWHERE if self.leader_addresses(p) else Where.UNKNOWN

    def leader_addresses(self, p: int) -> list[str]:
        """Where partition p's primary serves, as far as this node knows: []
        while there is none. Never this node unless it is primary, so a relay
        cannot loop back into itself."""
        view = self._views[p]
        if view is None or not view.epoch or view.released or not view.address:
            return []
        if view.holder == self.name and self._machines[p].state not in (LeaseState.PRIMARY, LeaseState.ACQUIRING):
            return []
        return [view.address]

    def all_known(self) -> bool:
        """Every partition has a primary, here or elsewhere."""
        return all(self.where(p) is not Where.UNKNOWN for p in range(self.partition_count))

    # -- the keeper ---------------------------------------------------------------------
    def _keep_leases(self) -> None:
        interval_s = min(self.ha.lease_renew_interval_ms / 2, 100) / 1000
        while not self._stopping.wait(interval_s):
            for p in range(self.partition_count):
                try:
                    self._keep_lease(p)
                except Exception:
                    log.exception("partition %d: lease keeping failed; retrying", p)
            try:
                self._changed()
            except Exception:
                log.exception("leadership change callback failed")

    def _keep_lease(self, p: int) -> None:
        machine, table = self._machines[p], self._tables[p]
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic() * 1000
            if machine.state is LeaseState.PRIMARY:
                action = machine.tick(now)
                if action is Action.RENEW:
                    late_ms = now - machine.renewed_ms
                    try:
                        ok = table.renew(machine.epoch)
                    except Exception:
                        if not machine.lapsed(now):
                            raise  # logged by the keeper loop, retried on the next tick
                        log.exception("partition %d: lease renewal failed after the lease ran out", p)
                        ok = False
                    action = machine.renewed(ok, now)
                    took_ms = time.monotonic() * 1000 - now
                    if late_ms + took_ms > self.ha.lease_duration_ms / 2:
                        # A starved process (CPU) or slow storage. Past the
                        # lease, a follower may take over: then this renewal
                        # fails and the partition steps down.
                        log.warning("partition %d: lease renewal %s %.0f ms after the last one (the commit "
                                    "took %.0f ms; the lease is %d ms)", p, "succeeded" if ok else "refused",
                                    late_ms + took_ms, took_ms, self.ha.lease_duration_ms)
            elif machine.state is LeaseState.FOLLOWER:
                view = self._views[p] = table.read()
                action = machine.observed(view, now)
                if action is Action.ACQUIRE:
                    epoch = machine.next_epoch()
                    try:
                        won = table.acquire(epoch, self.name, self.address, wall_time_us(),
                                            expected_version=None if view is None else view.version)
                    except Exception:
                        # The commit failed (a full disk, unreachable storage): a
                        # follower again, to try on a later round. Had it landed
                        # after all, the lease shows this node's own name, which
                        # a follower takes again at once with a newer epoch.
                        machine.acquired(None, now)
                        raise  # logged by the keeper loop
                    action = machine.acquired(epoch if won else None, now)
                    self._views[p] = table.read()
            else:
                return
        if action is Action.BECOME_PRIMARY:
            threading.Thread(target=self._become_primary, args=(p, machine.epoch, now), daemon=True,
                             name=f"take-{p}").start()
        elif action is Action.STEP_DOWN:
            self._step_down(p, "lease lapsed or taken over")

    def _become_primary(self, p: int, epoch: int, since_ms: float) -> None:
        log.info("partition %d: lease epoch %d taken; fencing and recovering", p, epoch)
        try:
            partition = self._serve(p, epoch)
        except Fenced as exc:
            log.warning("partition %d: a newer primary exists: %s", p, exc)
            self.fenced(p)
            return
        except Exception:
            log.exception("partition %d: could not start as primary; giving the lease up", p)
            self.fenced(p)
            return
        with self._lock:
            current = self._machines[p].state is LeaseState.PRIMARY and self._machines[p].epoch == epoch
        if not current or self._stopping.is_set():
            partition.stop()
            return
        self.partitions[p] = partition
        seconds = (time.monotonic() * 1000 - since_ms) / 1000
        log.info("partition %d: serving as primary, epoch %d (%.2f s after taking the lease)", p, epoch, seconds)
        self._changed()

    def fenced(self, p: int) -> None:
        """A commit of partition p met a newer epoch (or it could not start)."""
        with self._lock:
            action = self._machines[p].fenced()
        if action is Action.STEP_DOWN or p in self.partitions:
            self._step_down(p, "fenced by a newer primary")

    def _step_down(self, p: int, why: str) -> None:
        partition = self.partitions.pop(p, None)
        log.warning("partition %d: stepping down (%s)", p, why)
        if partition is not None:
            self._stepped_down(p, partition)

    # -- stopping -------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop keeping leases and hand every lease held over at once (the
        partitions themselves are the caller's to stop)."""
        self._stopping.set()
        self._keeper.join(5)
        with self._lock:
            for p, machine in enumerate(self._machines):
                if machine.stop() is Action.RELEASE:
                    try:
                        self._tables[p].release(machine.epoch, self.name, self.address, wall_time_us())
                    except Exception:
                        log.exception("partition %d: releasing the lease failed; it will lapse instead", p)
