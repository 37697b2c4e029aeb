"""Replay: post a queue's history into a queue through the normal PUT path.

    taproot replay --from taproot://demo/orders --to taproot://demo/orders-replay \\
        --since 2026-11-21T10:00:00 --until 2026-11-21T11:00:00 --where "properties['region'] = 'EU'"

A Spark job selects the history from the source queue's delivery log (one row
per message: duplicates were already dropped), by `put_time` range or as of a
delivery-log version (time travel), filtered by any Spark SQL predicate over
the message's columns (the delivery row joined to its PUT row on seq:
`properties`, `payload`, `put_time`, `apps`, ...), in PUT order (`seq`). The rows are then posted to the
target queue with the SDK, like any producer: new GUIDs, every PUT ACKed or
counted as failed with its code. Payloads travel as stored (a compressed
payload stays compressed and keeps its compression flag) with their typed
properties.

Rate: as fast as the target accepts (`--rate 0`, the default: columnar PUT
frames of `bulk_rows` messages, each checked, committed and ACKed as a whole),
a fixed rate (`--rate N` msg/s), or the original spacing of the PUTs
(`--original-rate`); the paced modes post message by message.

How the history reaches the poster: one Spark job range-partitions the
selection by `seq`, sorts each partition and writes it as Parquet into a
staging directory under the data directory (`_replay/<run id>`, removed
afterwards). The driver then streams the files in partition order, one file in
memory at a time, while Spark is free. Files are sized from the selection's
byte count, so memory stays bounded whatever the history's size. Collecting
slices straight from Spark (`toArrow` per seq range) ran at about half the
speed: each slice was a Spark job competing with the posting for the same cores.
"""

from __future__ import annotations

import sys
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from os.path import join
from typing import TYPE_CHECKING, Any, Callable, Iterator, Union

import pyarrow as pa
import pyarrow.fs as pafs

from protocol import ResultCode, parse_queue_uri
from protocol.expression import sql_string
from protocol.properties import maps_to_wire
from protocol.tls import ClientTls
from storage import tables
from taproot import Session, TaprootError
from taproot.compression import ALGORITHMS
from taproot.futures import PutFuture

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from taproot.session import Queue


BULK_ROWS = 5_000                  # messages per columnar PUT frame at full speed
STAGE_FILE_ROWS = 1_000_000        # messages per staged file at most (Spark's maxRecordsPerFile)
READ_BATCH_ROWS = 65_536           # staged rows read at a time (a Parquet row group at most)
AckFuture = Union[Future[Any], PutFuture]   # a columnar frame's future, or one PUT's


class ReplayError(ValueError):
    """Bad replay arguments (queue URI, time range, predicate)."""


@dataclass
class ReplayResult:
    selected: int = 0
    posted: int = 0
    acked: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    select_seconds: float = 0.0   # the Spark job: select, order and stage the history
    seconds: float = 0.0          # posting: first PUT to last ACK

    @property
    def rate(self) -> float:
        """Sustained posting rate: ACKed messages per second of posting."""
        return self.acked / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        total = self.select_seconds + self.seconds
        overall = f"{self.acked / total:,.0f}" if total else "0"
        return (f"replayed {self.acked} of {self.selected} selected messages in {self.seconds:.1f} s "
                f"({self.rate:,.0f} msg/s); posted {self.posted}, failed: {failed}; "
                f"Spark selected and staged them in {self.select_seconds:.1f} s ({overall} msg/s overall)")


def select_history(spark: "SparkSession", data_dir: str, partitions: int, source: str, *,
                   since: str | None = None, until: str | None = None, version: int | None = None,
                   where: str | None = None) -> "DataFrame":
    """The DataFrame of messages to replay (not yet ordered)."""
    from pyspark.sql import functions as F

    from protocol.uri import partition_of

    uri = parse_queue_uri(source)
    if isinstance(uri, str):
        raise ReplayError(f"--from {source!r}: {uri}")
    if version is not None and (since or until):
        raise ReplayError("give --version or --since/--until, not both")
    paths = tables.PartitionPaths(data_dir, partition_of(uri, partitions))
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    # The delivery log says which messages (duplicates already dropped); the
    # PUT log, joined on seq, has their payloads and properties.
    delivered = (reader.load(paths.delivery)
                 .where((F.col("domain") == uri.domain) & (F.col("queue") == uri.queue))
                 .select("seq", "delivered_time", "batch_id", "apps"))
    puts = spark.read.format("delta").load(paths.puts).drop("domain", "queue")
    df = delivered.join(puts, "seq").withColumn("domain", F.lit(uri.domain)).withColumn("queue", F.lit(uri.queue))
    for bound, op in ((since, ">="), (until, "<")):
        if bound:
            df = df.where(f"put_time {op} to_timestamp({sql_string(bound)})")
    if where:
        df = df.where(where)
    return df.select("seq", "payload", "properties", "property_types", "compression", "put_time")




class _Pacer:
    """Sleeps to hold a rate, or to keep the original spacing of PUTs."""

    def __init__(self, rate: float, original: bool):
        self.rate, self.original = rate, original
        self.started = time.monotonic()
        self.first_put_us: int | None = None
        self.count = 0

    def wait(self, put_time_us: int) -> None:
        self.count += 1
        if self.original:
            if self.first_put_us is None:
                self.first_put_us = put_time_us
            due = self.started + (put_time_us - self.first_put_us) / 1e6
        elif self.rate > 0:
            due = self.started + self.count / self.rate
        else:
            return
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def replay(spark: "SparkSession", data_dir: str, partitions: int, hosts: list[str], source: str, target: str, *,
           since: str | None = None, until: str | None = None, version: int | None = None,
           where: str | None = None, rate: float = 0.0, original_rate: bool = False,
           bulk_rows: int = BULK_ROWS, stage_file_rows: int = STAGE_FILE_ROWS,
           progress: Callable[[ReplayResult], None] | None = None, tls: ClientTls | None = None,
           token: str | None = None) -> ReplayResult:
    target_uri = parse_queue_uri(target)
    if isinstance(target_uri, str):
        raise ReplayError(f"--to {target!r}: {target_uri}")
    history = select_history(spark, data_dir, partitions, source, since=since, until=until, version=version,
                             where=where)
    result = ReplayResult()
    selecting = time.monotonic()
    with _Staged(data_dir) as stage:
        result.selected = stage.write(history, stage_file_rows)
        result.select_seconds = time.monotonic() - selecting
        if result.selected == 0:
            return result
        started = time.monotonic()
        pacer = _Pacer(rate, original_rate)
        with Session(hosts, tls=tls, token=token) as session, session.open_queue(target, write=True) as queue:
            futures: list[tuple[AckFuture, int]] = []
            last_report = 0.0
            for chunk in stage.read():
                if rate or original_rate:
                    futures.extend((f, 1) for f in _post_slice(queue, chunk, pacer, ALGORITHMS))
                else:  # full speed: columnar frames, checked and committed as a whole
                    for start in range(0, chunk.num_rows, bulk_rows):
                        part = chunk.slice(start, bulk_rows)
                        futures.append((queue.post_columns(part), part.num_rows))
                        futures = _settle(futures, result, block=False)
                result.posted += chunk.num_rows
                futures = _settle(futures, result, block=False)
                if progress is not None and time.monotonic() - last_report > 0.5:
                    result.seconds = time.monotonic() - started
                    progress(result)
                    last_report = time.monotonic()
            queue.flush()
            _settle(futures, result, block=True)
        result.seconds = time.monotonic() - started
    if progress is not None:
        progress(result)
    return result


def _parallelism(spark: "SparkSession") -> int:
    """The cores a sort can use: the SparkContext's default parallelism; a
    Spark Connect client has no SparkContext, and takes the session's
    shuffle partitions instead (the pipeline's endpoint: its setting)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # pyspark's Connect session: JVM_ATTRIBUTE_NOT_SUPPORTED
        return int(spark.conf.get("spark.sql.shuffle.partitions") or 2)


class _Staged:
    """The selected history, ordered by `seq`, as Parquet files under
    `<data_dir>/_replay/<run id>` (shared storage, so executors on other
    machines can write it), read back by the driver one file at a time."""

    def __init__(self, data_dir: str):
        self.path = join(data_dir, "_replay", uuid.uuid4().hex)

    def __enter__(self) -> "_Staged":
        return self

    def __exit__(self, *exc: object) -> None:
        fs, path = _filesystem(self.path)
        try:
            fs.delete_dir(path)
        except (FileNotFoundError, OSError):
            pass

    def write(self, history: "DataFrame", file_rows: int) -> int:
        """Run the Spark job; return how many messages were selected (from
        the staged files' footers: counting first would run the selection
        twice)."""
        (history.repartitionByRange(_parallelism(history.sparkSession), "seq")  # sort on every core
         .sortWithinPartitions("seq")
         .write.option("maxRecordsPerFile", file_rows).mode("error").parquet(self.path))
        import pyarrow.parquet as pq

        fs, _ = _filesystem(self.path)
        return sum(pq.ParquetFile(name, filesystem=fs).metadata.num_rows for name in self._files())

    def _files(self) -> list[str]:
        """The staged files in `seq` order: by task (range partitions in
        order), then by the piece of its sorted run (c000, c001, ...)."""
        fs, path = _filesystem(self.path)
        try:
            infos = fs.get_file_info(pafs.FileSelector(path))
        except FileNotFoundError:
            return []
        return sorted((i.path for i in infos if i.base_name.startswith("part-")), key=_part_number)

    def read(self) -> Iterator[pa.Table]:
        """The staged rows in `seq` order, `READ_BATCH_ROWS` at a time (one
        file's piece is in memory at once, however large the history)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fs, _ = _filesystem(self.path)
        last = -1
        for name in self._files():
            for batch in pq.ParquetFile(name, filesystem=fs).iter_batches(batch_size=READ_BATCH_ROWS):
                if batch.num_rows == 0:
                    continue
                seq = batch.column("seq")
                # Never post out of order: the range partitions and each run must not overlap.
                if seq[0].as_py() <= last or (batch.num_rows > 1 and
                                              not pc.all(pc.greater(seq[1:], seq[:-1])).as_py()):
                    raise RuntimeError(f"staged replay rows out of order in {name} (after seq {last})")
                last = seq[-1].as_py()
                yield pa.Table.from_batches([batch])


def _part_number(path: str) -> tuple[int, int]:
    name = path.rsplit("/", 1)[-1]  # part-00003-<uuid>-c001.snappy.parquet: task 3, its second file
    piece = name.rsplit("-c", 1)[1].split(".", 1)[0]
    return int(name.split("-")[1]), int(piece) if piece.isdigit() else 0


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for a local path or an object-store URI (s3a:// is S3)."""
    if "://" not in path:
        return pafs.LocalFileSystem(), path
    if path.startswith("s3a://"):
        path = "s3://" + path[len("s3a://"):]
    fs, inner = pafs.FileSystem.from_uri(path)
    return fs, str(inner)


def _post_slice(queue: Queue, chunk: pa.Table, pacer: _Pacer, codes: dict[str, int]) -> list[AckFuture]:
    columns = {name: chunk[name].to_pylist() for name in ("payload", "properties", "property_types",
                                                          "compression")}
    put_us = chunk["put_time"].cast(pa.int64()).to_pylist()
    post = queue._session._post  # the stored bytes as they are: no re-compression, no re-validation
    futures: list[AckFuture] = []
    for i in range(chunk.num_rows):
        pacer.wait(put_us[i])
        futures.append(post(queue, columns["payload"][i],
                            maps_to_wire(columns["properties"][i], columns["property_types"][i]), None,
                            codes.get(columns["compression"][i] or "", 0)))
    return futures


def _settle(futures: list[tuple[AckFuture, int]], result: ReplayResult, block: bool) -> list[tuple[AckFuture, int]]:
    """Count finished (future, messages) pairs; return the ones still waiting."""
    waiting = []
    for future, count in futures:
        if not block and not future.done():
            waiting.append((future, count))
            continue
        try:
            future.result(timeout=120)
            result.acked += count
        except TaprootError as exc:
            code = getattr(exc, "code", ResultCode.UNKNOWN)
            name = code.name if isinstance(code, ResultCode) else str(code)
            result.failed[name] = result.failed.get(name, 0) + count
        except TimeoutError:
            result.failed["TIMEOUT"] = result.failed.get("TIMEOUT", 0) + count
    return waiting


def print_progress(result: ReplayResult) -> None:
    done = result.acked + sum(result.failed.values())
    width = 30
    filled = int(width * done / result.selected) if result.selected else width
    rate = done / result.seconds if result.seconds else 0.0
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{result.selected} "
                     f"acked {result.acked} failed {sum(result.failed.values())} {rate:,.0f} msg/s")
    sys.stderr.flush()
    if done >= result.selected:
        sys.stderr.write("\n")
