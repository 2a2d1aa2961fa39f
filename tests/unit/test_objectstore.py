"""The local S3 store's and REST catalog's settings, without starting them."""

from pathlib import Path

import pytest
from cdclake_local import StackError
from cdclake_local.objectstore import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    LocalObjectStore,
    S3Credentials,
)
from cdclake_local.rest_catalog import LocalRestCatalog


@pytest.mark.parametrize(
    "key, secret",
    [("", "long-enough-secret"), ("key", ""), ("key", "short")],  # missing key, secret; too short
)
def test_the_store_refuses_to_start_without_an_access_key(monkeypatch, key, secret):
    monkeypatch.setenv(ACCESS_KEY_ENV, key)
    monkeypatch.setenv(SECRET_KEY_ENV, secret)
    with pytest.raises(StackError, match=f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV}"):
        S3Credentials.from_env()


def test_the_secret_reaches_the_catalog_by_its_environment_only(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(ACCESS_KEY_ENV, "key-id")
    monkeypatch.setenv(SECRET_KEY_ENV, "the-secret-value")
    creds = S3Credentials.from_env()
    assert "the-secret-value" not in repr(creds)
    store = LocalObjectStore(tmp_path / "s3", 19900, creds)
    catalog = LocalRestCatalog(tmp_path / "catalog", 18181, store)
    settings = catalog._settings()
    assert settings["CATALOG_S3_SECRET__ACCESS__KEY"] == "the-secret-value"
    assert settings["CATALOG_S3_ENDPOINT"] == "http://127.0.0.1:19900"
    assert settings["CATALOG_WAREHOUSE"] == catalog.warehouse == "s3://warehouse/lake"
    assert settings["CATALOG_IO__IMPL"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert catalog.uri == "http://127.0.0.1:18181"
