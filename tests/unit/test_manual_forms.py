"""The Params forms of cdclake_backfill, cdclake_snapshot and cdclake_dead_letters:
triggerable with their defaults, malformed values refused by the schema (as Airflow
validates a trigger), what a JSON field holds refused in words by the first task, the
Tables picker bounded when Kafka does not answer."""

from __future__ import annotations

import copy
import re
import time

import pytest
import yaml

from tests.conftest import DEMO_PIPELINE


@pytest.fixture(scope="module")
def dags(tmp_path_factory):
    from cdclake.pipeline_file import load_pipeline
    from cdclake_airflow.manual import (
        build_backfill_dag,
        build_dead_letters_dag,
        build_snapshot_dag,
    )

    pipelines = {"demo": load_pipeline(DEMO_PIPELINE)}
    choices = {"demo": [t.source for t in pipelines["demo"].tables]}
    return {
        "backfill": build_backfill_dag(pipelines, choices),
        "snapshot": build_snapshot_dag(pipelines, choices),
        "dead_letters": build_dead_letters_dag(pipelines),
    }


def _types(schema: dict) -> list:
    kind = schema.get("type")
    return kind if isinstance(kind, list) else [kind]


@pytest.mark.parametrize("form", ["backfill", "snapshot", "dead_letters"])
def test_every_form_can_be_triggered_with_its_defaults(dags, form):
    """The Airflow UI marks a field required when its schema's type does not include
    "null", and keeps Trigger disabled while a required field is empty (null or "")."""
    params = dags[form].params
    required_but_empty = [
        name
        for name in params
        if params.get_param(name).value in (None, "")
        and "null" not in _types(params.get_param(name).schema)
    ]
    assert not required_but_empty, f"{form}: required fields without a value"
    params.validate()  # every default is valid against its own schema
    for name in params:  # and every optional field may be left empty
        param = copy.deepcopy(params.get_param(name))
        if "null" in _types(param.schema):
            assert param.resolve(None) is None


REFUSED_AT_THE_FIELD = [
    ("snapshot", "timeout_minutes", 0),  # below the minimum
    ("snapshot", "action", "explode"),  # not in the enum
    ("snapshot", "surrogate_key", "id; drop table x"),  # not a column name
    ("snapshot", "tables", ["inventory.orders; drop"]),
    ("snapshot", "tables", ["orders"]),  # a snapshot names schema.table
    ("snapshot", "tables", ["inventory.orders", "inventory.orders"]),
    # a JSON field takes an object: the UI's editor refuses text that is not JSON
    ("snapshot", "filters", "quantity > 1"),
    ("snapshot", "filters", '{"inventory.orders": quantity > 1}'),
    ("backfill", "tables", ["a.b.c"]),
    ("backfill", "mode", "merge"),
    ("backfill", "start_offsets", "0:100"),  # not a JSON object
    ("backfill", "start_offsets", '{"0": 100}'),  # JSON text: the editor gives an object
    ("backfill", "start_timestamp", "yesterday"),
    ("backfill", "end_timestamp", "2026-11-22 at noon"),
    ("dead_letters", "action", "delete"),
    ("dead_letters", "table", "inventory.orders; drop"),
    ("dead_letters", "since", "last week"),
]


@pytest.mark.parametrize(("form", "name", "value"), REFUSED_AT_THE_FIELD)
def test_malformed_values_are_refused_at_the_field(dags, form, name, value):
    from airflow.sdk.definitions.param import ParamValidationError

    param = copy.deepcopy(dags[form].params.get_param(name))
    with pytest.raises(ParamValidationError):
        param.resolve(value)


ACCEPTED_AT_THE_FIELD = [
    ("snapshot", "filters", {"inventory.orders": "quantity > 1"}),
    # what the JSON holds is the first task's to check, in words (below)
    ("snapshot", "filters", {"orders": "quantity > 1"}),
    ("snapshot", "filters", {"inventory.orders": 5}),
    ("snapshot", "tables", ["inventory.orders", "inventory.customers"]),
    ("snapshot", "surrogate_key", "order_number"),
    ("backfill", "tables", ["orders"]),  # the lake table's name
    ("backfill", "start_offsets", {"0": 100}),
    ("backfill", "other_tables", ["inventory.new_table", ""]),
    ("backfill", "end_offsets", {"inventory.orders": {"0": 100}}),  # an object, by the API
    ("backfill", "start_timestamp", "2026-11-22T10:00:00+00:00"),
    ("backfill", "start_timestamp", "2026-11-22"),
    ("backfill", "end_timestamp", "1763805600000"),
    ("dead_letters", "table", "inventory.orders"),
    ("dead_letters", "since", "2026-11-27T08:00"),
]


@pytest.mark.parametrize(("form", "name", "value"), ACCEPTED_AT_THE_FIELD)
def test_well_formed_values_pass_the_field(dags, form, name, value):
    param = copy.deepcopy(dags[form].params.get_param(name))
    assert param.resolve(value) == value


def test_the_tables_picker_offers_listed_tables_when_kafka_does_not_answer(tmp_path):
    """A pattern's tables come from Kafka's topics; an unreachable broker costs at most the
    bound, and the listed tables are still offered."""
    from cdclake.pipeline_file import load_pipeline
    from cdclake_airflow.manual import build_snapshot_dag, picker_tables

    raw = yaml.safe_load(DEMO_PIPELINE.read_text())
    raw["kafka"]["bootstrap_servers"] = "127.0.0.1:9"  # nothing listens
    raw["tables"] = ["inventory.orders", "inventory.zoo_*"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    pipelines = {"demo": load_pipeline(tmp_path / "p.yaml")}
    began = time.monotonic()
    choices = picker_tables(pipelines, timeout_s=1.0)
    assert time.monotonic() - began < 5.0
    assert choices == {"demo": ["inventory.orders"]}
    dag = build_snapshot_dag(pipelines, choices)
    assert dag.params.get_param("tables").schema["examples"] == ["inventory.orders"]


REFUSED_BY_THE_FIRST_TASK = [
    ({"filters": {"orders": "quantity > 1"}}, "filter given for 'orders'"),
    ({"filters": {"inventory.orders": ""}}, "filter for 'inventory.orders' is empty"),
    ({"filters": {"inventory.orders": 5}}, "filter for 'inventory.orders' must be a string"),
    ({"filters": {"inventory.orders": "x > 1 and " * 500 + "true"}}, "at most 4,096"),
    ({"other_tables": ["inventory.nowhere"]}, "'inventory.nowhere' is not captured"),
]


@pytest.mark.parametrize(("params", "said"), REFUSED_BY_THE_FIRST_TASK)
def test_what_a_json_field_holds_is_refused_in_words_before_anything_is_sent(dags, params, said):
    """The snapshot form's values that pass Airflow's checks, refused by the first task
    (`snapshot_send`) before it sends anything, naming the field's value."""
    from cdclake.pipeline_file import load_pipeline
    from cdclake_airflow.tasks import form_tables
    from cdclake_control.signals import SignalError, parse_request, validate

    form = {**dags["snapshot"].params.dump(), "tables": ["inventory.orders"], **params}
    for name, value in params.items():  # the form lets it through
        copy.deepcopy(dags["snapshot"].params.get_param(name)).resolve(value)
    pipeline = load_pipeline(DEMO_PIPELINE)
    with pytest.raises(SignalError, match=re.escape(said)):
        request = parse_request(form["action"], form_tables(form), form["type"],
                                form["filters"], form["surrogate_key"])  # fmt: skip
        validate(request, [t.source for t in pipeline.tables])


def test_the_tables_a_form_names_are_those_picked_then_those_typed():
    from cdclake_airflow.tasks import form_tables

    assert form_tables({"tables": ["a.b"], "other_tables": ["c.d", "", " a.b ", "e.f"]}) == [
        "a.b", "c.d", "e.f",
    ]  # fmt: skip
    assert form_tables({"tables": None, "other_tables": None}) == []
