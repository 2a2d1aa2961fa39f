"""The driver JVM's options: the class-data-sharing archive and the JIT per batch size."""

import pytest
from cdclake.config import TableConfig
from cdclake.jvm import (
    ARCHIVE_ENV,
    DRIVER_OPTIONS,
    QUICK_JIT_RECORDS,
    RANGED_QUICK_JIT_RECORDS,
    archive_path,
    driver_java_options,
    resolves_by_range,
)
from cdclake.offsets import OffsetRange


@pytest.fixture
def archive(tmp_path, monkeypatch):
    path = tmp_path / "driver.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(path))
    return path


def test_the_archive_is_used_once_it_exists(archive):
    assert "SharedArchiveFile" not in driver_java_options(1_000_000)
    archive.write_bytes(b"built")
    options = driver_java_options(1_000_000)
    assert f"-XX:SharedArchiveFile={archive}" in options
    # the JVM's warnings go to stderr: the job's stdout carries its results
    assert options.endswith("-Xlog:disable -Xlog:all=warning:stderr")


@pytest.mark.parametrize(
    "records, quick",
    [(1, True), (QUICK_JIT_RECORDS, True), (QUICK_JIT_RECORDS + 1, False), (None, False)],
)
def test_small_batches_run_the_client_compiler_only(archive, records, quick):
    options = driver_java_options(records)
    assert ("-XX:TieredStopAtLevel=1" in options) is quick
    assert (options == "") is (not quick)  # no archive: nothing else to say


@pytest.mark.parametrize(
    "records, quick",
    [(QUICK_JIT_RECORDS + 1, True), (RANGED_QUICK_JIT_RECORDS, True),
     (RANGED_QUICK_JIT_RECORDS + 1, False), (None, False)],
)  # fmt: skip
def test_bigger_batches_resolved_range_by_range_run_the_client_compiler_only(
    archive, records, quick
):
    assert ("-XX:TieredStopAtLevel=1" in driver_java_options(records, ranged=True)) is quick
    assert "TieredStopAtLevel" not in driver_java_options(QUICK_JIT_RECORDS + 1, ranged=False)


def test_a_configured_key_over_several_partitions_keeps_a_batch_off_the_range_path():
    class Pipeline:
        tables = (TableConfig("inventory.a", "a"), TableConfig("inventory.b", "b"))

        def topic_for(self, table):
            return f"pg.{table.source}"

    def ranges(*where):
        return [OffsetRange(f"pg.inventory.{t}", p, 0, 10) for t, p in where]

    assert resolves_by_range(Pipeline())
    Pipeline.tables += (TableConfig("inventory.c", "c", key=("id",)),)
    assert not resolves_by_range(Pipeline())  # the batch's partitions unknown
    assert resolves_by_range(Pipeline(), ranges(("a", 0), ("a", 1), ("c", 0)))
    assert not resolves_by_range(Pipeline(), ranges(("a", 0), ("c", 0), ("c", 1)))


def test_the_pipeline_own_driver_options_win(archive, tmp_path):
    from cdclake.pipeline_file import load_pipeline
    from cdclake.spark import spark_conf

    archive.write_bytes(b"built")
    path = tmp_path / "p.yaml"
    text = (
        "name: shop\ntopic_prefix: pg\nkafka: {bootstrap_servers: 'k:9092'}\n"
        "catalog: {name: lake, type: rest, uri: 'http://127.0.0.1:8181', warehouse: wh}\n"
        "namespace: shop\ntables: [public.orders]\nspark: {conf: {spark.jars: /opt/mine.jar}}\n"
    )
    path.write_text(text)
    assert "SharedArchiveFile" in spark_conf(load_pipeline(path), records=10)[DRIVER_OPTIONS]
    path.write_text(text.replace("{spark.jars:", f"{{{DRIVER_OPTIONS}: -Xss4m, spark.jars:"))
    assert spark_conf(load_pipeline(path), records=10)[DRIVER_OPTIONS] == "-Xss4m"


def test_the_archive_can_be_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv(ARCHIVE_ENV, "off")
    assert archive_path() is None
    assert driver_java_options(None) == ""


def test_the_default_archive_is_named_after_spark_and_cached_per_user(monkeypatch, tmp_path):
    import importlib.metadata

    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = archive_path()
    version = importlib.metadata.version("pyspark")
    assert path.parent == tmp_path / "cdclake"
    assert path.name.startswith(f"spark-driver-{version}-") and path.suffix == ".jsa"
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "another-jdk"))
    assert archive_path() != path  # another Java, another archive


def test_a_reinstalled_spark_gets_a_new_archive(monkeypatch, tmp_path):
    """The JVM refuses an archive once a jar of its class path changed (a reinstall writes
    every jar anew), so a reinstall must not find the old archive under the same name."""
    import importlib.machinery
    import importlib.util
    import os

    install = tmp_path / "pyspark"
    (install / "jars").mkdir(parents=True)
    jar = install / "jars" / "spark-core.jar"
    jar.write_bytes(b"jar")
    spec = importlib.machinery.ModuleSpec("pyspark", None, origin=str(install / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    monkeypatch.delenv(ARCHIVE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = archive_path()
    assert archive_path() == path  # the same install, the same archive
    os.utime(jar, ns=(0, jar.stat().st_mtime_ns + 1_000_000_000))
    assert archive_path() != path


def test_the_load_task_takes_its_driver_options_from_the_plan(monkeypatch):
    """The plan knows the batch's size: the load's spark-submit renders its driver's Java
    options from the plan task's XCom, unless the pipeline sets them."""
    import dataclasses

    from cdclake.pipeline_file import load_pipeline
    from cdclake_airflow.factory import build_pipeline_dag
    from cdclake_airflow.tasks import DRIVER_OPTIONS_XCOM

    from tests.conftest import DEMO_PIPELINE

    pipeline = load_pipeline(DEMO_PIPELINE)
    load = build_pipeline_dag(pipeline).get_task("load")
    assert "conf" in load.template_fields
    template = load.conf[DRIVER_OPTIONS]
    assert "xcom_pull(task_ids='plan'" in template and DRIVER_OPTIONS_XCOM in template

    own = dataclasses.replace(pipeline.spark, conf={DRIVER_OPTIONS: "-Xss4m"})
    load = build_pipeline_dag(dataclasses.replace(pipeline, spark=own)).get_task("load")
    assert load.conf[DRIVER_OPTIONS] == "-Xss4m"


def test_a_new_archive_deletes_those_it_replaces(tmp_path):
    """Archives of the same install before a reinstall, or of an install that is gone,
    are deleted; another install's archive stays."""
    from cdclake_bench.jvm_archive import drop_replaced

    here, other, gone = (tmp_path / n / "jars" for n in ("here", "other", "gone"))
    here.mkdir(parents=True)
    other.mkdir(parents=True)
    archives = {}
    for name, jars in (("old", here), ("other", other), ("gone", gone), ("new", here)):
        archives[name] = tmp_path / f"spark-driver-3.5.9-{name}.jsa"
        archives[name].write_bytes(b"archive")
        if name != "new":
            archives[name].with_name(f"{archives[name].name}.from").write_text(str(jars))
    drop_replaced(archives["new"], here)
    assert sorted(p.name for p in tmp_path.glob("*.jsa")) == [
        "spark-driver-3.5.9-new.jsa",
        "spark-driver-3.5.9-other.jsa",
    ]
    assert (tmp_path / "spark-driver-3.5.9-new.jsa.from").read_text() == str(here)
