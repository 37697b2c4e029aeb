"""What registering the Taproot views costs over a PUT log of some size, and
what finding its message property names costs within that.

    .venv/bin/python -m taproot_ops.bench.views --rows 600000 --files 600 [--times 3] [--spark-scan]

Writes a PUT log of `--files` commits (1 KiB payloads, two properties on
every row, a third on one row of the last commit) on a temp dir, starts a
local Spark, then registers the views `--times` times as the pipeline's
endpoint does (one `PropertyKinds` kept between registrations: later ones
read no file again) and as a one-shot `taproot sql` does (a new one each
time). `--spark-scan` also times the Spark query that found the names
before `storage/property_kinds.py` (a scan of every row of the log).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from storage import deltars, tables
from taproot_ops.bench.commits import put_batch


def write_log(path: str, rows: int, files: int) -> None:
    per = max(1, rows // files)
    appender = deltars.Appender(path, tables.PUTS_SCHEMA, durable=False)
    for commit in range(files):
        properties = [[("region", "EU" if i % 2 else "US"), ("n", str(i))] for i in range(per)]
        types = [[("region", "string"), ("n", "int64")]] * per
        if commit == files - 1:
            properties[0] = properties[0] + [("late", "x")]
            types = [types[0] + [("late", "string")]] + types[1:]
        appender.append(put_batch(per, commit * per, 1024, properties, types))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--spark-scan", action="store_true")
    args = parser.parse_args(argv)

    from storage import spark as spark_factory
    from storage.property_kinds import PropertyKinds
    from storage.views import register_views

    with tempfile.TemporaryDirectory(prefix="taproot-bench-views-") as data:
        path = tables.PartitionPaths(data, 0).puts
        started = time.monotonic()
        write_log(path, args.rows, args.files)
        print(f"PUT log: {args.rows:,} rows in {args.files} files, written in {time.monotonic() - started:.1f} s",
              flush=True)
        spark = spark_factory.session("taproot-bench-views")
        try:
            kept = PropertyKinds()
            for label, keep in (("kept between registrations (the endpoint)", True),
                                ("new each time (a one-shot taproot sql)", False)):
                for attempt in range(args.times):
                    properties = kept if keep else PropertyKinds()
                    started = time.monotonic()
                    names = properties.read([path])
                    read_s = time.monotonic() - started
                    register_views(spark, data, [0], properties=properties)
                    print(f"register_views, properties {label}, #{attempt + 1}: "
                          f"{time.monotonic() - started:.2f} s, of which the names {read_s:.2f} s "
                          f"({len(names)} names)", flush=True)
            if args.spark_scan:
                query = ("SELECT k, collect_set(property_types[k]) AS types FROM (SELECT property_types, "
                         f"explode(map_keys(properties)) AS k FROM delta.`{path}`) GROUP BY k")
                for attempt in range(args.times):
                    started = time.monotonic()
                    found = spark.sql(query).collect()
                    print(f"the names by a Spark scan of the log, #{attempt + 1}: {time.monotonic() - started:.2f} s "
                          f"({len(found)} names)", flush=True)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
