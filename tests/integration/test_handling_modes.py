"""The connector's other handling modes: a second and third connector on the same source,
configured with them, captures a copy of the type_zoo, written by the JSON converter or
the Avro one (with the local registry); each pipeline loads it and the lake equals the
source, compared in PostgreSQL with what each mode keeps."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake_local import StackError

from tests.integration.helpers import assert_lake_equals_source, load_all, make_pipeline
from tests.integration.test_avro import avro_pipeline

VARIANTS = {
    "a": {"decimal.handling.mode": "string", "time.precision.mode": "connect",
          "binary.handling.mode": "hex", "hstore.handling.mode": "map",
          "interval.handling.mode": "string"},
    "b": {"decimal.handling.mode": "double",
          "time.precision.mode": "adaptive_time_microseconds",
          "binary.handling.mode": "base64-url-safe"},
    "c": {"binary.handling.mode": "base64"},
}  # fmt: skip
LAKE_TYPES = {  # what each variant's columns land as
    "a": {"c_num": "string", "c_bytea": "string", "c_interval": "string",
          "c_hstore": "map<string,string>", "c_time": "string", "c_ts6": "timestamp_ntz"},
    "b": {"c_num": "double", "c_money": "double", "c_bytea": "string", "c_interval": "bigint"},
    "c": {"c_num": "decimal(12,4)", "c_bytea": "string"},
}  # fmt: skip


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_every_handling_mode_loads_what_postgresql_holds(stack, spark, tmp_path, request, fmt):
    n = f"{fmt[0]}{uuid.uuid4().hex[:6]}"
    t = f"inventory.zoo_{n}"
    registry = request.getfixturevalue("registry") if fmt == "avro" else None
    converters = {} if registry is None else {**registry.converter_config("key"),
                                               **registry.converter_config("value")}  # fmt: skip
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {t} (like inventory.type_zoo including all)")
        conn.execute(f"insert into {t} select * from inventory.type_zoo where id < 100")
    captures = {}
    try:
        for v, modes in VARIANTS.items():
            captures[v] = stack.start_capture(f"m{v}{n}", {**modes, **converters,
                                                           "table.include.list": t})  # fmt: skip
            if registry is not None:  # one at a time: Apicurio 2.4 can fail a connector
                stack.wait_for_capture(prefix=f"m{v}{n}")  # registering what another does
        with psycopg.connect(stack.source_dsn, autocommit=True) as conn:  # streamed changes
            conn.execute(f"insert into {t} select id + 10, c_bool, c_bit1, c_bit8, c_varbit, "
                         "c_int2, c_int4, c_int8, c_real, c_double, c_num, c_num_free, c_money, "
                         "c_char, c_varchar, c_text, c_ts0, c_ts3, c_ts6, c_tstz, c_date, c_time, "
                         "c_time0, c_timetz, c_interval, c_bytea, c_json, c_jsonb, c_xml, c_uuid, "
                         "c_point, c_ltree, c_citext, c_inet, c_cidr, c_macaddr, c_macaddr8, "
                         "c_int4range, c_int8range, c_numrange, c_tsrange, c_tstzrange, "
                         f"c_daterange, c_enum, c_hstore, c_int_arr, c_text_arr, c_domain, "
                         f"c_big_text from {t} where id < 10")  # fmt: skip
            conn.execute(
                f"update {t} set c_bytea = '\\x00fbff'::bytea, c_interval = '-1 mon 2 days', "
                "c_num = -c_num, c_time = '13:14:15.123456' where id = 11"
            )
            conn.execute(f"delete from {t} where id = 13")
        for v, modes in VARIANTS.items():
            stack.wait_for_capture(prefix=f"m{v}{n}")
            connector = {k.replace(".", "_"): m for k, m in modes.items()}
            if registry is None:
                pipeline = make_pipeline(tmp_path, f"it_modes_{v}_{n}", [t],
                                         topic_prefix=f"m{v}{n}", connector=connector)  # fmt: skip
            else:
                pipeline = avro_pipeline(tmp_path, f"it_modes_{v}_{n}", t, f"m{v}{n}", registry,
                                         "avro", connector=connector)  # fmt: skip
            load_all(stack, spark, pipeline, f"modes-{v}")
            assert_lake_equals_source(pipeline, stack.source_dsn)
            lake = spark.table(pipeline.qualified_target(pipeline.tables[0]))
            types = dict(lake.dtypes)
            assert {c: types[c] for c in LAKE_TYPES[v]} == LAKE_TYPES[v], v
            assert lake.count() == 5  # ids 1, 2, 3, 11, 12 (13 deleted)
        # a connector that stops reading: waiting for it names its slot and ends
        stack.connect.pause(captures["a"])
        with pytest.raises(StackError, match=f"slot cdclake_ma{n} read no WAL for 5s"):
            stack.wait_for_capture(timeout=5, prefix=f"ma{n}")
    finally:
        for name in captures.values():
            stack.stop_capture(name)
