import json

import pytest
from cdclake_control.signals import (
    Action,
    SignalError,
    SnapshotRequest,
    SnapshotType,
    new_signal_id,
    parse_request,
    signal_data,
    validate,
)

CAPTURED = ["inventory.orders", "inventory.customers", "public.weird$name"]


def test_execute_snapshot_uses_additional_conditions_plural():
    request = SnapshotRequest(
        Action.EXECUTE,
        ("inventory.orders",),
        SnapshotType.INCREMENTAL,
        {"inventory.orders": "quantity > 1"},
        "order_number",
    )
    validate(request, CAPTURED)
    data = signal_data(request)
    assert data == {
        "data-collections": ["inventory\\.orders"],
        "type": "incremental",
        "additional-conditions": [
            {"data-collection": "inventory.orders", "filter": "(quantity > 1)"}
        ],
        "surrogate-key": "order_number",
    }
    assert "additional-condition" not in json.dumps(data).replace("additional-conditions", "")


@pytest.mark.parametrize(
    "request_, reason",
    [
        (SnapshotRequest(Action.EXECUTE, ()), "at least one table"),
        (SnapshotRequest(Action.EXECUTE, ("orders",)), "<schema>.<table>"),
        (SnapshotRequest(Action.EXECUTE, ("a.b.c",)), "<schema>.<table>"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders; drop",)), "<schema>.<table>"),
        (SnapshotRequest(Action.EXECUTE, ('inventory."orders"',)), "<schema>.<table>"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.missing",)), "not captured"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",), filters={"x.y": "a=1"}),
         "not being snapshotted"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",),
                         filters={"inventory.orders": "a=1; delete from t"}), "separators"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",),
                         filters={"inventory.orders": "a=1 -- comment"}), "comments"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",),
                         filters={"inventory.orders": "a=1 /* x */"}), "comments"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",),
                         filters={"inventory.orders": "   "}), "empty"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",), surrogate_key="a b"),
         "not a column name"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.orders",), surrogate_key="x;y"),
         "not a column name"),
        (SnapshotRequest(Action.STOP, ("inventory.nope",)), "not captured"),
        (SnapshotRequest(Action.EXECUTE, (" inventory.orders",)), "<schema>.<table>"),
        (SnapshotRequest(Action.EXECUTE, ("inventory.",)), "<schema>.<table>"),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused_before_anything_is_sent(request_, reason):
    with pytest.raises(SignalError, match=reason.replace("(", r"\(").replace("$", r"\$")):
        validate(request_, CAPTURED)


def test_signal_ids_are_long_enough_and_unique():
    a, b = new_signal_id("run-1"), new_signal_id("run-1")
    assert a != b and 42 <= len(a) <= 64 and a.startswith("cdclake-run-1-")


@pytest.mark.parametrize("max_chars", [42, 50, 64, 1000])
def test_signal_ids_fit_the_signal_tables_id_column(max_chars):
    run = "cdclake_snapshot-manual__2026-11-26T09:00:00.123456+00:00"
    ids = {new_signal_id(run, max_chars) for _ in range(100)}
    assert len(ids) == 100  # unique however short
    assert all(42 <= len(i) <= min(max_chars, 64) for i in ids)
    assert all(i.startswith("cdclake-cdclake_snapsho") for i in ids)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ('{"inventory.orders": "quantity > 1"}', {"inventory.orders": "quantity > 1"}),  # JSON text
        ({"inventory.orders": "quantity > 1"}, {"inventory.orders": "quantity > 1"}),  # object
        ("", {}),  # an emptied box
        (None, {}),
        ('{"inventory.orders": quantity > 1}', "not valid JSON"),  # the condition unquoted
        ('{"inventory.orders": "quantity > 1"', "not valid JSON"),  # no closing brace
        ('["quantity > 1"]', "must be an object"),
        ('{"inventory.orders": 1}', "must be a string"),
    ],
)  # fmt: skip
def test_the_filters_box_is_an_object_or_its_json_text(filters, expected):
    if isinstance(expected, str):
        with pytest.raises(SignalError, match=expected):
            parse_request("execute", ["inventory.orders"], filters=filters)
        return
    request = parse_request("execute", ["inventory.orders"], filters=filters)
    assert request.filters == expected


def test_empty_form_fields_take_their_defaults():
    request = parse_request("pause", None, None, None, None)
    assert (request.tables, request.type, request.filters, request.surrogate_key) == (
        (), SnapshotType.INCREMENTAL, {}, None)  # fmt: skip
