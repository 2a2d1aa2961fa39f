"""The MERGE statement's join condition with the batch's keys."""

import pytest
from cdclake.changes import Column, TopicSchema
from cdclake.merge import build_merge_sql

ID = Column("id", "bigint", False)
ONE_KEY = TopicSchema(key=(ID,), columns=(ID, Column("name", "string")))


def test_the_keys_go_into_the_join_condition_on_the_table_alone():
    sql = build_merge_sql("lake.ns.t", "src", ONE_KEY, key_values=[3, 10, 42])
    on = sql.split(" WHEN ", 1)[0]
    assert on.endswith("ON t.`id` = s.`id` AND t.`id` IN (3, 10, 42)")
    assert "IN (" not in build_merge_sql("lake.ns.t", "src", ONE_KEY)


@pytest.mark.parametrize(
    "schema, truncate",
    [
        (ONE_KEY, True),  # WHEN NOT MATCHED BY SOURCE must see every row
        (TopicSchema(key=(Column("a", "int", False), Column("b", "int", False)),
                     columns=(Column("a", "int", False), Column("b", "int", False))), False),
    ],
)  # fmt: skip
def test_a_key_filter_is_refused_where_it_would_change_the_outcome(schema, truncate):
    with pytest.raises(ValueError, match="one key column and no truncate"):
        build_merge_sql("lake.ns.t", "src", schema, truncate=truncate, key_values=[1])
