"""A Confluent-compatible schema registry (Confluent Schema Registry, Apicurio Registry's
`/apis/ccompat/v7`, Karapace), asked through confluent-kafka's own client
(`confluent_kafka.schema_registry`): the Avro schema of each id the records carry (its
caller, `cdclake.debezium.avro.translation`, asks once per id and process). Every request
is bounded (`RegistryConfig.timeout_s`, three tries); a registry that cannot be reached
fails naming its URL, and an id it does not hold is an error of the records that carry
it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from cdclake.exceptions import EndpointError

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

_ATTEMPTS = 3


class UnknownSchema(Exception):
    """The registry answered, but holds no Avro schema of that id (the message says why)."""


@dataclass(frozen=True)
class RegistryConfig:
    url: str  # up to the API's root, e.g. http://registry:8080/apis/ccompat/v7
    # `user:password` for HTTP basic authentication (from an environment variable or an
    # Airflow connection: it is never logged)
    user_info: str = ""
    timeout_s: float = 30.0

    def __repr__(self) -> str:  # the user info stays out of logs and task errors
        return f"RegistryConfig(url={self.url!r}, timeout_s={self.timeout_s})"


@cache
def _client(registry: RegistryConfig) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {
        "url": registry.url,
        "timeout": registry.timeout_s,
        "max.retries": _ATTEMPTS - 1,
        "retries.wait.ms": 1000,
        "retries.max.wait.ms": 2000,
    }
    if registry.user_info:
        conf["basic.auth.user.info"] = registry.user_info
    return SchemaRegistryClient(conf)


def schema_text(registry: RegistryConfig, sid: int) -> str:
    """The Avro schema (JSON text) of id `sid`; `UnknownSchema` when the registry holds
    none; `EndpointError` naming the URL when it cannot be asked."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        schema = _client(registry).get_schema(sid)
    except SchemaRegistryError as exc:
        status = exc.http_status_code
        if status == 404:
            why = f"schema id {sid} is not in the registry at {registry.url}"
            raise UnknownSchema(why) from None
        if status in (401, 403):
            why = f"refused the login (HTTP {status}): check its user_info"
            raise EndpointError(f"schema registry at {registry.url} {why}") from None
        raise EndpointError(_not_given(registry, sid, f"HTTP {status}")) from None
    except Exception as exc:  # its HTTP library's own errors: refused, reset, timed out
        raise EndpointError(_not_given(registry, sid, f"{type(exc).__name__}: {exc}")) from None
    kind = schema.schema_type or "AVRO"
    if kind != "AVRO" or not isinstance(schema.schema_str, str):
        where = f"the registry at {registry.url}"
        raise UnknownSchema(f"schema id {sid} in {where} is not an Avro schema ({kind})")
    return schema.schema_str


def _not_given(registry: RegistryConfig, sid: int, why: str) -> str:
    tries = f"{_ATTEMPTS} tries of up to {registry.timeout_s:.0f}s each"
    return f"schema registry at {registry.url} did not give schema id {sid} ({tries}): {why}"
