"""Records an Avro converter wrote with a schema registry (`kafka.format: avro` and
`avro-flat`) resolve to the rows their JSON-converter twins resolve to; a record that is
not Avro of a schema the registry holds is kept with why; a registry that cannot be
reached fails naming its URL."""

from __future__ import annotations

import http.server
import json
import threading
from decimal import Decimal

import pyarrow as pa
import pytest
from cdclake.debezium.avro import AvroRawRows
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.registry import RegistryConfig
from cdclake.exceptions import EndpointError
from cdclake.resolve.fold import resolve_rows
from cdclake_bench.avro_records import AvroWriter

from tests.debezium_records import decimal_b64, unscaled_b64
from tests.unit.test_json_flat import records
from tests.unit.test_resolve import TOPIC, raw_table, topic_of


class _Registry(http.server.BaseHTTPRequestHandler):
    """The Confluent registry API's `GET /schemas/ids/<id>` of the server's schemas."""

    def do_GET(self):  # noqa: N802 (the handler's name)
        login = getattr(self.server, "login", None)
        if login and self.headers.get("Authorization") != login:
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error_code": 401, "message": "Unauthorized"}')
            return
        sid = self.path.rpartition("/")[2]
        schema = self.server.schemas.get(int(sid)) if sid.isdigit() else None
        body = json.dumps({"schema": json.dumps(schema)} if schema else {"error_code": 40403})
        self.send_response(200 if schema else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def registry():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    server.schemas = {}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, RegistryConfig(f"http://127.0.0.1:{server.server_port}/apis/ccompat/v7",
                                 timeout_s=5)  # fmt: skip
    server.shutdown()


def as_avro(server, pairs: list) -> list:
    """The records as the Avro converter writes them, their schemas in `server`."""

    def register(subject: str, schema) -> int:
        known = [sid for sid, s in server.schemas.items() if s == schema]
        if not known:
            known = [100 + len(server.schemas)]
            server.schemas[known[0]] = schema
        return known[0]

    write = AvroWriter(register)
    return [(write(key, "t-key"), write(value, "t-value")) for key, value in pairs]


def avro_table(config: RegistryConfig, pairs: list) -> pa.Table:
    rows = AvroRawRows(TOPIC, 0, config)
    rows.add_many(list(range(len(pairs))), [1000 + i for i in range(len(pairs))],
                  [k for k, _ in pairs], [v for _, v in pairs])  # fmt: skip
    return pa.Table.from_batches([rows.batch()])


def resolved(rows: pa.Table, fmt: WireFormat) -> list[dict]:
    schema, keys, values = topic_of(rows, fmt=fmt)
    return sorted(resolve_rows(rows, schema, keys, values).rows.to_pylist(),
                  key=lambda r: r["id"])  # fmt: skip


@pytest.mark.parametrize("flat", [False, True], ids=["envelope", "flattened"])
def test_avro_records_resolve_as_their_json_twins(registry, flat):
    server, config = registry
    pairs = records(flat)
    json_fmt, avro_fmt = (WireFormat.JSON_FLAT, WireFormat.AVRO_FLAT) if flat else (
        WireFormat.JSON, WireFormat.AVRO)  # fmt: skip
    want = resolved(raw_table({0: pairs}), json_fmt)
    got = resolved(avro_table(config, as_avro(server, pairs)), avro_fmt)
    assert got == want
    assert [r["id"] for r in got] == [1, 2, 3, 4]


def test_bytes_decimals_and_times_keep_their_values(registry):
    from tests.debezium_records import key_record, value_record

    server, config = registry
    row = {"id": 7, "name": "x", "price": decimal_b64(Decimal("-12.34"), 2), "day": 19000,
           "at": 1_700_000_000_123_456, "at_tz": "2024-01-02T03:04:05.5Z",
           "blob": unscaled_b64(-1)}  # fmt: skip
    pairs = [(key_record(7), value_record("c", None, row))]
    want = resolved(raw_table({0: pairs}), WireFormat.JSON)
    got = resolved(avro_table(config, as_avro(server, pairs)), WireFormat.AVRO)
    assert got == want
    assert got[0]["price"] == Decimal("-12.34") and got[0]["blob"] == b"\xff"


def test_records_that_are_not_avro_of_a_known_schema_are_kept_with_why(registry):
    server, config = registry
    good = as_avro(server, records(False)[:1])[0]
    unknown = good[1][:1] + (999).to_bytes(4, "big") + good[1][5:]
    pairs = [good, (good[0], b'{"schema":{}}'), (good[0], unknown), (good[0], good[1][:12])]
    rows = avro_table(config, pairs).to_pylist()
    assert [r["error"] for r in rows][0] is None
    errors = [r["error"] for r in rows][1:]
    assert errors[0].startswith("value: not Avro in the Confluent wire format")
    assert errors[1] == f"value: schema id 999 is not in the registry at {config.url}"
    assert errors[2] == "value: not Avro of schema id 101 (EOFError: it ends early)"
    assert [r["offset"] for r in rows] == [0, 1, 2, 3]


def test_a_registry_that_cannot_be_reached_fails_naming_its_url(registry):
    server, config = registry
    pairs = as_avro(server, records(False)[:1])
    gone = RegistryConfig("http://127.0.0.1:9/apis/ccompat/v7", "user:secret", timeout_s=1)
    with pytest.raises(EndpointError, match=r"schema registry at http://127.0.0.1:9/apis") as e:
        avro_table(gone, pairs)
    assert "secret" not in str(e.value) and "secret" not in repr(gone)


def test_a_decimal_keeps_the_connect_parameters_not_the_converters_precision():
    """Connect's decimal without a precision (PostgreSQL money, numeric without one) gets
    precision 64 from the Avro converter: the lake type follows Connect's parameters."""
    from cdclake.debezium.avro import Translation

    money = {"type": "bytes", "scale": 2, "precision": 64, "connect.version": 1,
             "connect.parameters": {"scale": "2"}, "logicalType": "decimal",
             "connect.name": "org.apache.kafka.connect.data.Decimal"}  # fmt: skip
    plain = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}
    schema = {"type": "record", "name": "r", "fields": [{"name": "m", "type": money},
                                                         {"name": "p", "type": plain}]}  # fmt: skip
    fields = json.loads(Translation(json.dumps(schema)).schema)["fields"]
    assert [f.get("parameters") for f in fields] == [
        {"scale": "2"}, {"scale": "3", "connect.decimal.precision": "10"}]  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_in_avro_resolve_as_in_json(registry, seed):
    """The randomized replay test's histories (re-sends, tombstones, TOAST, snapshot
    reads, truncates), as the Avro converter writes them: the same rows as their JSON,
    which that test checks against the rules."""
    from tests.unit.test_resolve import history

    server, config = registry
    parts = history(seed, partitions=1 + seed % 2)
    batches = []
    for partition, pairs in parts.items():
        rows = AvroRawRows(TOPIC, partition, config)
        avro = as_avro(server, pairs)
        rows.add_many(list(range(len(avro))), [0] * len(avro), [k for k, _ in avro],
                      [v for _, v in avro])  # fmt: skip
        batches.append(rows.batch())
    got = pa.Table.from_batches(batches)
    want = raw_table(parts)
    for rows in (got, want):
        assert rows.column("error").null_count == rows.num_rows
    key = lambda r: (r["id"], r["_cdc_kafka_partition"])  # noqa: E731
    assert sorted(resolve_rows(got, *topic_of(got, fmt=WireFormat.AVRO)).rows.to_pylist(),
                  key=key) == sorted(resolve_rows(want, *topic_of(want)).rows.to_pylist(),
                                     key=key)  # fmt: skip


def test_a_registry_asks_for_its_login_and_a_wrong_one_fails_naming_it(registry):
    """HTTP basic authentication with the pipeline's `user_info`: the schema with the
    right login; with a wrong one, an error naming the registry and not the login."""
    import base64

    from cdclake.debezium.registry import schema_text

    server, config = registry
    as_avro(server, records(False)[:1])
    server.login = "Basic " + base64.b64encode(b"reader:right").decode()
    url, sid = config.url, next(iter(server.schemas))
    assert json.loads(schema_text(RegistryConfig(url, "reader:right", timeout_s=5), sid))
    with pytest.raises(EndpointError, match="refused the login \\(HTTP 401\\)") as e:
        schema_text(RegistryConfig(url, "reader:wrong", timeout_s=5), sid)
    assert "wrong" not in str(e.value) and url in str(e.value)
