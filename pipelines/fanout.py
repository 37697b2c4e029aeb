"""Fanout: which apps each message goes to, decided in Spark.

Every delivery row gets an `apps` column: the apps of its domain whose
application subscription matches the message's properties (all of them when
there is no subscription). In a priority domain the one app is "". An app left
out has the message auto-confirmed (BlazingMQ's rule): the primary never pushes
it to that app's consumers. The message is stored once, whatever the number of
apps; confirm state is kept per app in the confirm log.

The subscriptions are BlazingMQ expressions (`protocol/expression.py`) rendered
as Spark SQL over the `properties` / `property_types` maps, so they run inside
the micro-batch with no Python UDF. The expression is rebuilt for every batch
from the current domain configuration, so editing a domain file takes effect
without restarting the job.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Mapping

import conf
from conf import DomainConfig
from protocol.expression import compile_expression, sql_string

log = logging.getLogger(__name__)



def domain_apps_sql(domain: DomainConfig) -> str:
    """ARRAY<STRING> of the domain's apps that the current row goes to."""
    items = []
    for app in domain.apps:
        text = domain.subscriptions.get(app)
        if text is None:
            items.append(sql_string(app))
        else:
            condition = compile_expression(text).to_spark_sql()
            items.append(f"IF(coalesce({condition}, FALSE), {sql_string(app)}, NULL)")
    return f"array_compact(array({', '.join(items)}))" if any(
        a in domain.subscriptions for a in domain.apps) else f"array({', '.join(items)})"


ROUTED_SQL = "CAST(array() AS ARRAY<STRING>)"


def target_apps_sql(domains: Mapping[str, DomainConfig]) -> str:
    """One CASE over the row's domain. A domain the pipeline does not know
    (configured after it started, or removed) keeps the priority default [""]:
    the primary, which reloads too, decides what to do with it. A
    `queue@cluster` row (the primary stores its own cluster's queues without
    the suffix) goes to no app here: a federation link forwards it."""
    branches = [f"WHEN {sql_string(name)} THEN {domain_apps_sql(d)}"
                for name, d in sorted(domains.items()) if d.mode != "broadcast"]
    local = f"CASE domain {' '.join(branches)} ELSE array('') END" if branches else "array('')"
    return f"CASE WHEN instr(queue, '@') > 0 THEN {ROUTED_SQL} ELSE {local} END"


class DomainsReloader:
    """The current domains, re-read when a file in `domains/` changes. A file
    that fails validation is logged (naming the field) and the last good
    configuration stays in force."""

    def __init__(self, directory: Path, initial: Mapping[str, DomainConfig]):
        self.directory = directory
        self._domains = dict(initial)
        self._stamp = conf.domain_files(directory)
        self._lock = threading.Lock()

    def __call__(self) -> Mapping[str, DomainConfig]:
        with self._lock:
            try:
                stamp = conf.domain_files(self.directory)
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._domains = conf.load_domains(self.directory)
                    log.info("domains reloaded: %s", ", ".join(sorted(self._domains)))
            except conf.ConfigError as exc:
                log.error("domain reload rejected, keeping the previous configuration: %s", exc)
            except Exception:   # never the pipeline's batch: it keeps the last good domains
                log.exception("domain reload failed, keeping the previous configuration")
            return self._domains


DomainsProvider = Callable[[], Mapping[str, DomainConfig]]
