"""What a Spark Connect session takes from the pipeline, and the catalog a load's metadata
reads come from, as the session's settings name it."""

from __future__ import annotations

import json

import pytest
from cdclake.config import CatalogType
from cdclake.exceptions import ConfigError
from cdclake.iceberg.catalog import catalog_of_settings, sqlalchemy_uri
from cdclake.pipeline_file import load_pipeline
from cdclake.spark import DRIVER_CONF, catalog_spark_conf, remote_url, session_conf

from tests.unit.test_timeouts import PIPELINE, write


def pipeline_with(tmp_path, **sections):
    text = PIPELINE + "".join(f"{k}: {json.dumps(v)}\n" for k, v in sections.items())
    return load_pipeline(write(tmp_path, text))


def test_a_session_takes_the_catalog_and_sql_settings_but_not_the_drivers(tmp_path):
    p = pipeline_with(tmp_path, spark={"conf": {
        "spark.sql.shuffle.partitions": "3", "spark.executor.memory": "2g",
        "spark.sql.extensions": "x.Y"}})  # fmt: skip
    conf = session_conf(p)
    assert conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.sql.catalog.lake.uri"] == p.catalog.uri
    assert "spark.executor.memory" not in conf
    assert not set(DRIVER_CONF) & set(conf)


def test_the_catalog_read_back_from_a_sessions_settings_is_the_pipelines(tmp_path):
    p = pipeline_with(tmp_path, timeouts={"connect_s": 4, "request_s": 45})
    settings = [*catalog_spark_conf(p.catalog).items(), ("spark.sql.shuffle.partitions", "8")]
    found = catalog_of_settings(settings, "lake")
    assert (found.type, found.uri, found.warehouse) == (
        CatalogType.JDBC,
        p.catalog.uri,
        p.catalog.warehouse,
    )
    assert found.properties == p.catalog.properties
    assert sqlalchemy_uri(found) == sqlalchemy_uri(p.catalog)  # same login, same timeouts
    with pytest.raises(ConfigError, match="no Iceberg catalog 'other'"):
        catalog_of_settings(settings, "other")


def test_the_remote_url_carries_the_token_as_a_header_not_as_grpcs_token():
    url = remote_url("spark-connect", 15002, "s3cret")
    assert url == "sc://spark-connect:15002/;x-cdclake-token=s3cret"
    assert ";token=" not in url  # pyspark would then want TLS, which the server lacks


def test_a_server_that_is_not_there_fails_the_session_at_once_naming_it(tmp_path):
    import socket
    import time

    from cdclake.exceptions import EndpointError
    from cdclake.spark import connect_session

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = pipeline_with(tmp_path)
    started = time.monotonic()
    with pytest.raises(EndpointError, match=f"Spark Connect server at 127.0.0.1:{port}"):
        connect_session(p, remote_url("127.0.0.1", port, "t" * 32), "unit")
    assert time.monotonic() - started < 5
