"""Every PostgreSQL type of the demo's type_zoo, through the real connector, equal in the
lake as PostgreSQL itself compares it; values outside the mapping fail loudly."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake.compare import compare_table
from cdclake.exceptions import DecodeError

from tests.integration.helpers import load_all, make_pipeline

pytestmark = pytest.mark.integration


def zoo_equal(pipeline, dsn) -> bool:
    [zoo] = [t for t in pipeline.tables if t.source == "inventory.type_zoo"]
    return compare_table(pipeline, zoo, dsn).equal


def test_type_zoo_insert_update_delete(stack, spark, tmp_path):
    pipeline = make_pipeline(tmp_path, f"it_zoo_{uuid.uuid4().hex[:6]}", ["inventory.type_zoo"])
    load_all(stack, spark, pipeline, "zoo-1")
    assert zoo_equal(pipeline, stack.source_dsn)

    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(
            "insert into inventory.type_zoo select id + 100, c_bool, c_bit1, c_bit8, c_varbit, "
            "c_int2, c_int4, c_int8, c_real, c_double, c_num, c_num_free, c_money, c_char, "
            "c_varchar, c_text, c_ts0, c_ts3, c_ts6, c_tstz, c_date, c_time, c_time0, c_timetz, "
            "c_interval, c_bytea, c_json, c_jsonb, c_xml, c_uuid, c_point, c_ltree, c_citext, "
            "c_inet, c_cidr, c_macaddr, c_macaddr8, c_int4range, c_int8range, c_numrange, "
            "c_tsrange, c_tstzrange, c_daterange, c_enum, c_hstore, c_int_arr, c_text_arr, "
            "c_domain, c_big_text from inventory.type_zoo where id < 100"
        )
        conn.execute(
            "update inventory.type_zoo set c_num = -c_num, c_num_free = c_num_free * -3, "
            "c_text = c_text || ' ✓', c_int_arr = c_int_arr || 5, c_bytea = '\\xdeadbeef', "
            "c_interval = c_interval * 2, c_bit8 = ~c_bit8, c_jsonb = '{\"n\": null}', "
            "c_tstz = c_tstz + interval '1 microsecond' where id > 100"
        )
        conn.execute("update inventory.type_zoo set c_text = 'big unchanged' where id = 101")
        conn.execute("delete from inventory.type_zoo where id = 102")
    load_all(stack, spark, pipeline, "zoo-2")
    assert zoo_equal(pipeline, stack.source_dsn)

    # the comparison can fail: change the source without loading
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute("update inventory.type_zoo set c_interval = c_interval + interval '1 us'")
    assert not zoo_equal(pipeline, stack.source_dsn)
    load_all(stack, spark, pipeline, "zoo-3")
    assert zoo_equal(pipeline, stack.source_dsn)


def test_values_outside_the_mapping_fail_with_the_offset(stack, spark, tmp_path):
    n = uuid.uuid4().hex[:6]
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table inventory.inf_{n} (id int primary key, at timestamptz)")
        conn.execute(f"insert into inventory.inf_{n} values (1, now()), (2, 'infinity')")
    pipeline = make_pipeline(tmp_path, f"it_inf_{n}", [f"inventory.inf_{n}"])
    with pytest.raises(DecodeError, match=rf"inf_{n} partition 0 offset 1: value does not fit"):
        load_all(stack, spark, pipeline, "inf")
