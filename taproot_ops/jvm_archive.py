"""A class-data-sharing archive of the classes a Spark driver loads (JDK's
AppCDS, `-XX:ArchiveClassesAtExit`), made once per machine and matched to
its JVM and jars, for JVMs that start often: the test suite's.

A Spark driver loads about 20,000 classes on start; read from the archive
instead of parsed and verified from the jars, its start-up took 4.4 s of CPU
instead of 7.4 s on this project's 2-core machine (docs/benchmarks.md). The
suite starts about 40 such JVMs.

`python -m taproot_ops.jvm_archive` makes the archive (about 40 s: a Spark
session that writes and reads a Delta table, then exits) unless one for this
JVM and these jars is there, and prints its path. `archive_options()` gives
the JVM options that use it, or "" when there is none: a JVM whose class
path differs from the one the archive was made with (a standalone cluster's
daemons) or that cannot map it runs as without it (`-Xshare:auto`, the
default).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The archive's own messages (a class path that does not match, say) stay out
# of the roles' logs and the tests' output: the JVM then just runs without it.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java_home() -> Path:
    """The JVM pyspark starts: $JAVA_HOME's, else the `java` on PATH's."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if java is None:
        raise OSError("no java on PATH")
    return Path(os.path.realpath(java)).parents[1]


def _key() -> str:
    """What the archive depends on: the JVM's build (its libjvm.so) and every
    jar a driver may load (pyspark's and Delta's, `storage.spark`), by path, size
    and time. Cheap: no JVM, no pyspark import (`make test-fast` pays it too)."""
    from storage import spark as spark_factory

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise OSError("pyspark is not installed")
    home = _java_home()
    libjvm = home / "lib" / "server" / "libjvm.so"
    files = [libjvm if libjvm.is_file() else home / "bin" / "java"]
    files += sorted((Path(spec.origin).parent / "jars").glob("*.jar"))
    files += sorted((spark_factory._ivy_dir(object_store=False) / "jars").glob("*.jar"))
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path() -> Path:
    from storage import spark as spark_factory

    return spark_factory.cache_dir() / "cds" / f"spark-driver-{_key()}.jsa"


def archive_options() -> str:
    """JVM options that use this machine's archive, or "" when there is none."""
    try:
        path = archive_path()
    except OSError:
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path.is_file() else ""


_WORKLOAD = """
import sys
from storage import spark as spark_factory
spark = spark_factory.session("taproot-cds")
path = sys.argv[1]
spark.range(100).selectExpr("id", "cast(id as string) AS s").write.format("delta").save(path)
spark.range(100, 200).selectExpr("id", "cast(id as string) AS s").write.format("delta").mode("append").save(path)
spark.read.format("delta").load(path).groupBy("s").count().collect()
spark.sql(f"SELECT count(*) FROM delta.`{path}` WHERE id > 50").collect()
spark.stop()
"""


def make(force: bool = False) -> Path:
    """Make the archive unless there is one for this JVM and these jars."""
    path = archive_path()
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("spark-driver-*.jsa"):   # another JVM's or other jars'
        old.unlink(missing_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    env = dict(os.environ)
    # C1 only, as the suite's JVMs: the archive does not depend on it, and the run costs less.
    env["TAPROOT_JVM_OPTIONS"] = f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} {QUIET}"
    with tempfile.TemporaryDirectory(prefix="taproot-cds-") as work:
        subprocess.run([sys.executable, "-c", _WORKLOAD, os.path.join(work, "t")], env=env, check=True,
                       cwd=Path(__file__).resolve().parents[1])
    # The driver JVM writes the archive as it exits, after the Python that started it.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _complete(partial):
        time.sleep(0.5)
    if not _complete(partial):
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM wrote no class-data archive at {partial}")
    partial.replace(path)
    return path


def _complete(partial: Path) -> bool:
    """The archive is written and its JVM gone (no process has it open for writing)."""
    if not partial.is_file():
        return False
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            for fd in fd_dir.iterdir():
                if os.readlink(fd) == str(partial):
                    return False
        except OSError:
            continue
    return True


def main(argv: list[str]) -> int:
    """Make the archive; a failure says why and leaves the suite to start its
    JVMs without one (slower, not wrong)."""
    try:
        print(make(force="--force" in argv))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"no class-data archive ({exc}); the suite's JVMs start without one", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
