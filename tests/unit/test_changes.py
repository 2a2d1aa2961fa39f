import json

import pytest
from cdclake.debezium.connect import parse_connect_schema
from cdclake.debezium.schema import Column, column_types, misfit, topic_schema, unify_columns
from cdclake.exceptions import DecodeError


def fields(*cols):
    return parse_connect_schema(
        {"type": "struct", "fields": [{"type": t, "optional": True, "field": n} for n, t in cols]}
    ).fields


def test_unify_keeps_latest_order_and_old_columns():
    cols = unify_columns(
        [fields(("id", "int32"), ("old", "string")), fields(("id", "int32"), ("new", "string"))],
        "t",
    )
    assert [c.name for c in cols] == ["id", "new", "old"]


def test_unify_applies_widening():
    cols = unify_columns([fields(("n", "int32")), fields(("n", "int64"))], "t")
    assert cols == (Column("n", "bigint"),)


def test_unify_rejects_unrelated_changes_naming_column_and_types():
    with pytest.raises(DecodeError, match="topic x: column 'n' is int in the lake but string"):
        unify_columns([fields(("n", "string")), fields(("n", "int32"))], "topic x")


def test_a_narrower_version_keeps_the_wider_type():
    cols = unify_columns([fields(("n", "int64")), fields(("n", "int32"))], "t")
    assert cols == (Column("n", "bigint"),)
    assert unify_columns([fields(("n", "int32"))], "t", {"n": "bigint"}) == (Column("n", "bigint"),)


def test_the_table_type_wins_over_the_newest_version_and_widening_promotes_it():
    old, new = fields(("n", "string")), fields(("n", "int32"))
    assert column_types([old, new], {}) == {"n": "int"}  # no table: the newest version
    types = column_types([old, new], {"n": "string"})
    assert types == {"n": "string"}
    assert misfit(old, types) is None
    assert "column 'n' is string in the lake but int" in misfit(new, types)
    assert column_types([fields(("n", "int64"))], {"n": "int"}) == {"n": "bigint"}


def test_excluded_columns_may_change_type():
    versions = [fields(("a", "int32"), ("x", "string")), fields(("a", "int32"), ("x", "int32"))]
    assert unify_columns(versions, "t", {"x": "string"}, exclude=("x",)) == (Column("a", "int"),)


def _envelope(*cols):
    row = [{"type": t, "optional": True, "field": n} for n, t in cols]
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"type": "struct", "fields": row, "field": "before"},
                {"type": "struct", "fields": row, "field": "after"},
                {"type": "string", "field": "op"},
            ],
        }
    )


def test_topic_schema_takes_key_from_kafka_key_and_marks_it_required():
    key = '{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}]}'
    schema = topic_schema([key], [_envelope(("id", "int32"), ("name", "string"))], (), "t")
    assert schema.key == (Column("id", "int", False),)
    assert schema.columns == (Column("id", "int", False), Column("name", "string", True))


def test_table_without_key_is_a_changelog_unless_a_key_is_configured():
    schema = topic_schema([], [_envelope(("a", "int32"))], (), "pg.public.nokey")
    assert schema.key_names == () and all(c.nullable for c in schema.columns)
    schema = topic_schema([], [_envelope(("a", "int32"), ("b", "string"))], ("a",), "t")
    assert schema.key_names == ("a",)


def test_configured_key_must_be_a_column():
    with pytest.raises(DecodeError, match=r"\['zz'\]"):
        topic_schema([], [_envelope(("a", "int32"))], ("zz",), "t")
