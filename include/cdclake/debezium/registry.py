"""A Confluent-compatible schema registry (Confluent Schema Registry, Apicurio Registry's
`/apis/ccompat/v7`, Karapace): the Avro schema of each id the records carry (its caller,
`cdclake.debezium.avro.translation`, asks once per id and process). Every request is
bounded; a registry that cannot be reached fails naming its URL, and an id it does not
hold is an error of the records that carry it."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from cdclake.exceptions import EndpointError

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


def schema_text(registry: RegistryConfig, sid: int) -> str:
    """The Avro schema (JSON text) of id `sid`; `UnknownSchema` when the registry holds
    none; `EndpointError` naming the URL when it cannot be asked."""
    url = f"{registry.url.rstrip('/')}/schemas/ids/{sid}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if registry.user_info:
        token = base64.b64encode(registry.user_info.encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    for attempt in range(_ATTEMPTS):
        try:
            with urllib.request.urlopen(request, timeout=registry.timeout_s) as answer:
                body = json.loads(answer.read())
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise UnknownSchema(
                    f"schema id {sid} is not in the registry at {registry.url}"
                ) from None
            if exc.code in (401, 403):
                raise EndpointError(
                    f"schema registry at {registry.url} refused the "
                    f"login (HTTP {exc.code}): check its user_info"
                ) from None
            why = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = str(getattr(exc, "reason", exc))
        if attempt + 1 == _ATTEMPTS:
            raise EndpointError(f"schema registry at {registry.url} did not give schema id "
                                f"{sid} ({_ATTEMPTS} tries of up to {registry.timeout_s:.0f}s "
                                f"each): {why}")  # fmt: skip
        time.sleep(1.0 + attempt)
    kind = body.get("schemaType", "AVRO") if isinstance(body, dict) else None
    if kind != "AVRO" or not isinstance(body.get("schema"), str):
        raise UnknownSchema(f"schema id {sid} in the registry at {registry.url} is not an "
                            f"Avro schema ({kind or 'no schema'})")  # fmt: skip
    return body["schema"]
