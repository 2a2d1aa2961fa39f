"""The jars a load adds to Spark: by catalog, from the folder CDCLAKE_SPARK_JARS names
(stack/spark/pom.xml resolved from Maven Central), the pipeline's own settings winning."""

from pathlib import Path

import pytest
from cdclake.exceptions import ConfigError
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import SPARK_JARS_ENV, SparkJar, spark_conf

JDBC = """
name: shop
topic_prefix: pg
kafka: {bootstrap_servers: "k:9092"}
catalog: {name: lake, type: jdbc, uri: "jdbc:postgresql://db:5432/cat", warehouse: wh}
namespace: shop
tables: [public.orders]
"""
REST_S3 = JDBC.replace(
    '{name: lake, type: jdbc, uri: "jdbc:postgresql://db:5432/cat", warehouse: wh}',
    '{name: lake, type: rest, uri: "http://127.0.0.1:8181", warehouse: "s3://wh/"}',
)
REST_LOCAL = REST_S3.replace('"s3://wh/"', "wh")
POM = Path(__file__).resolve().parents[2] / "stack" / "spark" / "pom.xml"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A jar folder as `cdclake_local.maven.jars("spark")` lays it out."""
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("iceberg-spark-runtime-3.5_2.12-1.10.1", "iceberg-aws-bundle-1.10.1",
                 "postgresql-42.7.14", "checker-qual-3.48.3"):  # fmt: skip
        (jars / f"{name}.jar").write_bytes(b"")
    monkeypatch.setenv(SPARK_JARS_ENV, str(jars))
    return jars


def pipeline(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_pipeline(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        (JDBC, ["iceberg-spark-runtime-3.5_2.12-1.10.1", "postgresql-42.7.14"]),  # JDBC catalog
        (REST_S3, ["iceberg-spark-runtime-3.5_2.12-1.10.1", "iceberg-aws-bundle-1.10.1"]),  # S3
        (REST_LOCAL, ["iceberg-spark-runtime-3.5_2.12-1.10.1"]),  # REST, files on local disk
    ],
)
def test_each_catalog_gets_the_jars_it_needs(tmp_path, folder, text, expected):
    jars = spark_conf(pipeline(tmp_path, text))["spark.jars"].split(",")
    assert [Path(j).stem for j in jars] == expected
    assert all(Path(j).parent == folder for j in jars)


@pytest.mark.parametrize(
    "setting, value",
    [("spark.jars", "/opt/mine.jar"), ("spark.jars.packages", "org.example:mine:1")],
)
def test_the_pipelines_own_jars_win(tmp_path, monkeypatch, setting, value):
    monkeypatch.delenv(SPARK_JARS_ENV, raising=False)  # not needed then
    text = JDBC + f"spark: {{conf: {{{setting}: '{value}'}}}}\n"
    conf = spark_conf(pipeline(tmp_path, text))
    assert conf[setting] == value
    assert "spark.jars" not in conf or conf["spark.jars"] == value


def test_no_jar_folder_says_what_to_run_or_set(tmp_path, monkeypatch):
    monkeypatch.delenv(SPARK_JARS_ENV, raising=False)
    p = pipeline(tmp_path, JDBC)
    with pytest.raises(ConfigError, match=SPARK_JARS_ENV) as err:
        spark_conf(p)
    assert str(p.path) in str(err.value) and "cdclake local up" in str(err.value)
    assert "spark.jars.packages" in str(err.value)


def test_a_missing_jar_is_named_with_its_folder(tmp_path, folder):
    (folder / "iceberg-aws-bundle-1.10.1.jar").unlink()
    with pytest.raises(ConfigError, match=f"no iceberg-aws-bundle jar in {folder}"):
        spark_conf(pipeline(tmp_path, REST_S3))


def test_every_jar_is_pinned_in_the_stacks_pom():
    text = POM.read_text()
    for jar in SparkJar:
        assert f"<artifactId>{jar.value}</artifactId>" in text
