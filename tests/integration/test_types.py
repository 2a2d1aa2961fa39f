"""Every PostgreSQL type of the demo's type_zoo, through the real connector, equal in the
lake as PostgreSQL itself compares it; values outside the mapping fail loudly."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake_control.compare import compare_table

from tests.integration.helpers import (
    assert_lake_equals_source,
    assert_resolved_in,
    load_all,
    make_pipeline,
)

pytestmark = pytest.mark.integration


def zoo_equal(pipeline, dsn) -> bool:
    [zoo] = [t for t in pipeline.tables if t.source == "inventory.type_zoo"]
    return compare_table(pipeline, zoo, dsn).equal


def test_type_zoo_insert_update_delete(stack, spark, tmp_path, resolve_in):
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute("delete from inventory.type_zoo where id >= 100")  # an earlier run's
    pipeline = make_pipeline(tmp_path, f"it_zoo_{uuid.uuid4().hex[:6]}", ["inventory.type_zoo"])
    assert_resolved_in(load_all(stack, spark, pipeline, "zoo-1", resolve_in), resolve_in)
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
    assert_resolved_in(load_all(stack, spark, pipeline, "zoo-2", resolve_in), resolve_in)
    assert zoo_equal(pipeline, stack.source_dsn)

    # the comparison can fail: change the source without loading
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute("update inventory.type_zoo set c_interval = c_interval + interval '1 us'")
    assert not zoo_equal(pipeline, stack.source_dsn)
    load_all(stack, spark, pipeline, "zoo-3", resolve_in)
    assert zoo_equal(pipeline, stack.source_dsn)


def test_infinite_dates_and_timestamps_load_as_the_ends_of_the_range(
    stack, spark, tmp_path, resolve_in
):
    n = uuid.uuid4().hex[:6]
    t = f"inventory.inf_{n}"
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(
            f"create table {t} (id int primary key, d date, t3 timestamp(3), "
            "t6 timestamp(6), tz timestamptz)"
        )
        conn.execute(
            f"insert into {t} values (1, 'infinity', 'infinity', 'infinity', 'infinity'), "
            "(2, '-infinity', '-infinity', '-infinity', '-infinity'), "
            "(3, '2024-02-29', '2024-02-29 01:02:03.456', '2024-02-29 01:02:03.456789', "
            "'2024-02-29 01:02:03.456789+00'), (4, NULL, NULL, NULL, NULL)"
        )
    pipeline = make_pipeline(tmp_path, f"it_inf_{n}", [t])
    assert_resolved_in(load_all(stack, spark, pipeline, "inf", resolve_in), resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    rows = {
        r["id"]: r
        for r in spark.table(pipeline.qualified_target(pipeline.tables[0]))
        .selectExpr(
            "id", "cast(d as string) d", "cast(t6 as string) t6", "cast(tz as string) tz"
        )  # fmt: skip
        .collect()
    }
    assert (rows[1]["d"], rows[1]["t6"]) == ("9999-12-31", "9999-12-31 23:59:59.999999")
    assert (rows[2]["d"], rows[2]["t6"]) == ("0001-01-01", "0001-01-01 00:00:00")
    assert rows[3]["t6"] == "2024-02-29 01:02:03.456789" and rows[4]["d"] is None


def test_postgis_geometry_and_geography(stack, spark, tmp_path, resolve_in):
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        if conn.execute("select to_regclass('inventory.geo_zoo')").fetchone()[0] is None:
            pytest.skip("PostGIS is not installed (apt-get install postgis), so no geo_zoo")
        conn.execute("delete from inventory.geo_zoo where id >= 100")
        conn.execute("insert into inventory.geo_zoo select id + 100, g, g_point, g_poly "
                     "from inventory.geo_zoo where id < 100")  # fmt: skip
        conn.execute(
            "update inventory.geo_zoo set g = ST_Translate(g, 1, 1), "
            "g_poly = 'SRID=4326;POLYGON((1 1, 2 1, 2 2, 1 1))' where id = 101"
        )
        conn.execute("delete from inventory.geo_zoo where id = 102")
    pipeline = make_pipeline(tmp_path, f"it_geo_{uuid.uuid4().hex[:6]}", ["inventory.geo_zoo"])
    assert_resolved_in(load_all(stack, spark, pipeline, "geo", resolve_in), resolve_in)
    assert_lake_equals_source(pipeline, stack.source_dsn)
    lake = spark.table(pipeline.qualified_target(pipeline.tables[0]))
    types = dict(lake.dtypes)
    assert types["g"] == types["g_poly"] == "struct<wkb:binary,srid:int>"
    srids = {r["id"]: r["srid"] for r in lake.selectExpr("id", "g_point.srid").collect()}
    assert srids[1] == 4326 and srids[2] is None
