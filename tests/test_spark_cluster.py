"""The pipeline on a Spark standalone cluster (issue 19, part 1): a master
and a worker started with Spark's own launcher from the pyspark install;
the embedded tree's pipeline runs there (`[pipeline] spark_master`), and is
the authority a `delivery = "pipeline"` domain waits for: every message is
pushed only after the cluster's executors decided it. `taproot sql` takes
the same setting and runs there too, beside the pipeline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from storage import deltars
from storage.tables import PartitionPaths
from taproot_ops.spark_standalone import SparkStandalone
from tests.conftest import collect, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    # Two cores: one for the pipeline (max_cores = 1), one for `taproot sql` beside it.
    with SparkStandalone(tmp_path_factory.mktemp("spark"), workers=1, cores=2, memory="3g") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tree(spark_cluster, tmp_path_factory):
    from taproot_ops.embedded import EmbeddedCluster

    conf_dir = tmp_path_factory.mktemp("conf")
    shutil.copytree(Path(__file__).resolve().parent / "cluster_conf", conf_dir, dirs_exist_ok=True)
    cluster_file = conf_dir / "cluster.toml"
    cluster_file.write_text(cluster_file.read_text().replace("[pipeline]\n", (
        f'[pipeline]\nspark_master = "{spark_cluster.master_url}"\nexecutor_memory = "1g"\n'
        "executor_cores = 1\nmax_cores = 1\n"), 1))
    # No JIT warm-up: nothing here times a message (it costs the pipeline
    # about 25 s of CPU, and its views' warm-up 30 more).
    with EmbeddedCluster(str(cluster_file), data_dir=str(tmp_path_factory.mktemp("data")),
                         ephemeral_ports=True, warm_up=False) as cluster:
        cluster.config_path = cluster_file     # type: ignore[attr-defined]
        yield cluster


def apps(spark_cluster, state: str = "activeapps") -> dict[str, dict]:
    return {a["name"]: a for a in spark_cluster.state()[state]}


def test_the_pipeline_runs_on_the_cluster_and_is_the_authority(spark_cluster, tree):
    from taproot import Session

    pipeline = apps(spark_cluster).get("taproot-pipeline")
    assert pipeline is not None and pipeline["cores"] == 1 and pipeline["state"] == "RUNNING", \
        spark_cluster.state()["activeapps"]
    uri = f"taproot://authority/cluster-{uuid.uuid4().hex[:8]}"
    with Session([tree.client_address]) as session:
        writer = session.open_queue(uri, write=True)
        reader = session.open_queue(uri, read=True)
        guids = [f.result(timeout=60).guid for f in [writer.post(f"m{i}".encode()) for i in range(200)]]
        got = collect(reader, 200, timeout_s=180)
    assert sorted(m.guid for m in got) == sorted(guids)
    # Pushed only after Spark decided: each has its row in the delivery log the cluster's executors wrote.
    delivery = deltars.try_open(PartitionPaths(tree.data_dir, 0).delivery)
    assert delivery is not None
    decided = set(delivery.to_pyarrow_table(columns=["guid"])["guid"].to_pylist())
    assert set(guids) <= decided
    # The executors did the work: the worker ran the pipeline's executor, not the driver alone.
    [worker] = spark_cluster.state()["workers"]
    assert worker["coresused"] >= 1


def posted(tree, count: int) -> str:
    """A fresh queue of the demo domain with `count` messages committed; its name."""
    from taproot import Session

    name = f"sql-{uuid.uuid4().hex[:8]}"
    with Session([tree.client_address]) as session, session.open_queue(f"taproot://demo/{name}", write=True) as q:
        for future in [q.post(b"x") for _ in range(count)]:
            future.result(timeout=60)
    return name


def new_app(spark_cluster, name: str, before: set[str]) -> None:
    wait_until(lambda: any(a["name"] == name and a["id"] not in before
                           for a in spark_cluster.state()["completedapps"]), 30, what=f"{name} on the master")


def counted(stdout: str) -> int:
    [row] = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return int(row["n"])


def test_taproot_sql_runs_on_the_same_cluster(spark_cluster, tree):
    queue = posted(tree, 7)
    before = {a["id"] for a in spark_cluster.state()["completedapps"]}
    out = subprocess.run([sys.executable, "-m", "taproot_ops.cli", "sql", "--config", str(tree.config_path),
                          "--data-dir", tree.data_dir, "--json",
                          f"SELECT count(*) AS n FROM taproot_puts WHERE queue = '{queue}'"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert counted(out.stdout) == 7
    new_app(spark_cluster, "taproot-sql", before)


def test_spark_submit_decides_the_master(spark_cluster, tree):
    """As docs/deploy.md shows it: spark-submit's --master and --packages are in
    force (the config's local default is not applied under spark-submit)."""
    from storage import spark as spark_factory
    from taproot_ops.spark_standalone import spark_home

    queue = posted(tree, 3)
    before = {a["id"] for a in spark_cluster.state()["completedapps"]}
    cli = Path(__file__).resolve().parents[1] / "taproot_ops" / "cli.py"
    # The driver as the suite's other JVMs (tests/conftest.py): C1 only and the
    # class-data archive (33 -> 13 s of CPU for a driver's start and one query here).
    out = subprocess.run([str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url,
                          "--driver-java-options", spark_factory.jvm_options(),
                          "--packages", spark_factory.DELTA_PACKAGE,
                          "--conf", f"spark.jars.ivy={spark_factory.cache_dir() / 'ivy'}",
                          "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.cores.max=1",
                          str(cli), "sql", "--data-dir", tree.data_dir, "--json",
                          f"SELECT count(*) AS n FROM taproot_puts WHERE queue = '{queue}'"],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYSPARK_PYTHON=sys.executable))   # the driver's Python: this one
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert counted(out.stdout) == 3
    new_app(spark_cluster, "taproot-sql", before)
