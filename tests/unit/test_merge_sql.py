"""The MERGE statement's join condition with the batch's keys."""

import pytest
from cdclake.debezium.schema import Column, TopicSchema
from cdclake.iceberg.merge_sql import KeyRange, build_merge_sql, key_filter_sql
from cdclake.resolve.rules import Truncate

ID = Column("id", "bigint", False)
ONE_KEY = TopicSchema(key=(ID,), columns=(ID, Column("name", "string")))


def test_the_keys_go_into_the_join_condition_on_the_table_alone():
    sql = build_merge_sql("lake.ns.t", "src", ONE_KEY, key_values={"id": [3, 10, 42]})
    on = sql.split(" WHEN ", 1)[0]
    assert on.endswith("ON t.`id` = s.`id` AND t.`id` IN (3L, 10L, 42L)")
    assert "IN (" not in build_merge_sql("lake.ns.t", "src", ONE_KEY)


TEXT = Column("code", "string", False)
TWO_KEYS = TopicSchema(key=(ID, TEXT), columns=(ID, TEXT, Column("name", "string")))


def test_text_and_composite_keys_filter_each_key_column():
    sql = build_merge_sql("lake.ns.t", "src", TWO_KEYS,
                          key_values={"id": [1, 2], "code": ["a b", "é"]})  # fmt: skip
    on = sql.split(" WHEN ", 1)[0]
    assert on.endswith(
        "ON t.`id` = s.`id` AND t.`code` = s.`code` AND t.`id` IN (1L, 2L) "
        "AND t.`code` IN ('a b', 'é')"
    )


def test_a_range_filters_an_integer_key_column_and_any_key_column_will_do():
    sql = build_merge_sql("lake.ns.t", "src", TWO_KEYS, key_values={"id": KeyRange(-5, 90)})
    on = sql.split(" WHEN ", 1)[0]
    assert on.endswith("AND t.`code` = s.`code` AND t.`id` BETWEEN -5 AND 90")


def test_a_text_key_with_a_quote_or_backslash_is_written_as_utf8_bytes():
    text = TopicSchema(key=(TEXT,), columns=(TEXT,))
    quoted, slashed = "it's", "a\\b"
    on = key_filter_sql(text, {"code": [quoted, slashed, "plain"]})
    assert on == (
        f" AND t.`code` IN (CAST(X'{quoted.encode().hex()}' AS STRING), "
        f"CAST(X'{slashed.encode().hex()}' AS STRING), 'plain')"
    )


@pytest.mark.parametrize(
    "schema, values, truncate, why",
    [
        # a truncate's NOT MATCHED BY SOURCE must see every row
        (ONE_KEY, {"id": [1]}, Truncate(0, 5, 100), "cannot go with a truncate"),
        (TWO_KEYS, {"name": ["x"]}, None, "takes some of the key columns"),
        (TWO_KEYS, {}, None, "takes some of the key columns"),
        (TWO_KEYS, {"code": KeyRange(1, 2)}, None, "no key range on 'code' of type string"),
        (TopicSchema(key=(Column("d", "date", False),), columns=(Column("d", "date", False),)),
         {"d": ["2024-01-01"]}, None, "no key filter on 'd' of type date"),
        (ONE_KEY, {"id": [None]}, None, "needs a value of 'id'"),
        (TopicSchema(key=(TEXT,), columns=(TEXT,)), {"code": ["\ud800"]}, None, "surrogate"),
    ],
)  # fmt: skip
def test_a_key_filter_is_refused_where_it_would_change_the_outcome(schema, values, truncate, why):
    with pytest.raises(ValueError, match=why):
        build_merge_sql("lake.ns.t", "src", schema, truncate=truncate, key_values=values)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("kind", ("identity", "kind")),
        ("bucket(16, id)", ("bucket[16]", "id")),
        ("bucket( 8 ,id )", ("bucket[8]", "id")),
        ("truncate(4, name)", ("truncate[4]", "name")),
        ("days(ts)", ("day", "ts")),
        ("day(ts)", ("day", "ts")),
        ("years(d)", ("year", "d")),
        ("months(d)", ("month", "d")),
        ("hours(ts)", ("hour", "ts")),
    ],
)
def test_a_partition_by_entry_is_read_as_iceberg_names_its_field(spec, field):
    """What `apply_table_settings` compares with the table's spec (Iceberg's transform
    names): every form the config accepts."""
    from cdclake.config_fields import partition_field

    assert partition_field(spec) == field


def test_only_properties_the_table_does_not_hold_are_set_again():
    """A table's properties against the pipeline's: a new or changed value is set; a
    property Iceberg keeps in the metadata instead (format-version) never counts as
    changed, or every load would set it again."""
    from cdclake.iceberg.tables import PIPELINE_PROPERTIES, property_changes

    names = '["a", "write.target-file-size-bytes"]'
    current = {"owner": "root", "write.target-file-size-bytes": "1000", "a": "1",
               PIPELINE_PROPERTIES: names}  # fmt: skip
    wanted = {"write.target-file-size-bytes": "2000", "a": "1", "b": "x", "format-version": "2"}
    assert property_changes(current, wanted) == (
        {"write.target-file-size-bytes": "2000", "b": "x",
         PIPELINE_PROPERTIES: '["a", "b", "write.target-file-size-bytes"]'}, [])  # fmt: skip
    same = {"a": "1", "write.target-file-size-bytes": "1000", "format-version": "2"}
    assert property_changes(current, same) == ({}, [])


def test_a_property_the_pipeline_no_longer_names_is_unset_or_set_back():
    """What the pipeline set before and no longer names is unset, or set back to
    cdclake's own value for the properties it sets at creation; properties set some
    other way, and those of a table without the record, are left alone."""
    from cdclake.iceberg.tables import PIPELINE_PROPERTIES, TABLE_PROPERTIES, property_changes

    current = {"owner": "root", "a": "1", "write.merge.mode": "copy-on-write",
               "write.update.mode": "merge-on-read",
               PIPELINE_PROPERTIES: '["a", "write.merge.mode", "write.update.mode"]'}  # fmt: skip
    to_set, to_unset = property_changes(current, {})
    assert to_unset == ["a"]
    assert to_set == {"write.merge.mode": TABLE_PROPERTIES["write.merge.mode"],
                      PIPELINE_PROPERTIES: "[]"}  # fmt: skip
    unrecorded = {k: v for k, v in current.items() if k != PIPELINE_PROPERTIES}
    assert property_changes(unrecorded, {}) == ({PIPELINE_PROPERTIES: "[]"}, [])
    garbled = {**current, PIPELINE_PROPERTIES: "not json"}
    assert property_changes(garbled, {"a": "1"})[1] == []


@pytest.mark.parametrize(
    "kind, written",
    [("tinyint", "-3Y, 7Y"), ("smallint", "-3S, 7S"), ("int", "-3, 7"), ("bigint", "-3L, 7L")],
)
def test_integer_keys_are_written_as_literals_of_their_column_type(kind, written):
    key = Column("k", kind, False)
    on = key_filter_sql(TopicSchema(key=(key,), columns=(key,)), {"k": [-3, 7]})
    assert on == f" AND t.`k` IN ({written})"
