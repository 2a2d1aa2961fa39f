"""Malformed snapshot requests are refused, naming what is wrong, with nothing written to
the signal table: checked against the real source database and Kafka."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from cdclake.signals import SignalError, parse_request, submit

from tests.integration.helpers import make_pipeline

N = uuid.uuid4().hex[:6]
T = f"inventory.sig_{N}"
OTHER = f"inventory.sig_other_{N}"


@pytest.fixture(scope="module")
def pipeline(stack, tmp_path_factory):
    with psycopg.connect(stack.source_dsn, autocommit=True) as conn:
        conn.execute(f"create table {T} (id int primary key, code text, v int)")
        conn.execute(f"create table {OTHER} (id int primary key, v int)")
    return make_pipeline(tmp_path_factory.mktemp("sig"), f"it_sig_{N}", [T, OTHER])


def signals(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select count(*) from public.debezium_signal").fetchone()[0]


MALFORMED = [
    ({"action": "snapshot-everything", "tables": [T]}, "action"),
    ({"action": "execute", "tables": [T], "type": "eventual"}, "type"),
    ({"action": "execute", "tables": []}, "at least one table"),
    ({"action": "execute", "tables": ["inventory.customers"]}, "not captured"),
    ({"action": "execute", "tables": ["sig_" + N]}, "<schema>.<table>"),
    ({"action": "execute", "tables": [T + "; drop table x"]}, "plain names"),
    ({"action": "execute", "tables": ['inventory."weird.name"']}, "plain names"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1; delete from t"}}, "separators"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1 -- all"}}, "comments"),
    ({"action": "execute", "tables": [T], "filters": {T: "id > 1 /* x */"}}, "comments"),
    ({"action": "execute", "tables": [T], "filters": {T: "   "}}, "empty"),
    ({"action": "execute", "tables": [T], "filters": {OTHER: "id > 1"}}, "not being snapshotted"),
    (
        {"action": "execute", "tables": [T], "filters": {T: "nosuchcol = 1"}},
        "not a valid condition",
    ),
    ({"action": "execute", "tables": [T], "filters": {T: "id >"}}, "not a valid condition"),
    ({"action": "execute", "tables": [T], "filters": {T: 5}}, "must be a string"),
    ({"action": "execute", "tables": [T, OTHER], "surrogate_key": "code"}, "not a column"),
    ({"action": "execute", "tables": [T], "surrogate_key": "code; x"}, "not a column name"),
    ({"action": "pause", "tables": [T]}, "give no tables"),
    ({"action": "stop", "tables": [T], "type": "blocking"}, "incremental snapshots only"),
    ({"action": "stop", "tables": [T], "filters": {T: "id > 1"}}, "execute-snapshot only"),
    ({"action": "execute", "tables": [T], "channel": "kafka"}, "signal_topic"),
    ({"action": "execute", "tables": [T], "channel": "carrier-pigeon"}, "channel"),
]


@pytest.mark.parametrize(("form", "message"), MALFORMED)
def test_malformed_request_is_refused_and_nothing_is_written(stack, pipeline, form, message):
    before = signals(stack.source_dsn)
    form = dict(form)
    channel = form.pop("channel", "source")
    with pytest.raises(SignalError, match=message):
        request = parse_request(**form)
        submit(pipeline, stack.source_dsn, request, channel=channel, origin="test")
    assert signals(stack.source_dsn) == before


def test_missing_source_table_is_refused(stack, pipeline, tmp_path):
    gone = make_pipeline(tmp_path, f"it_sig_gone_{N}", ["inventory.never_created_" + N])
    with pytest.raises(SignalError, match="does not exist in the source"):
        submit(gone, stack.source_dsn, parse_request("execute", [gone.tables[0].source]))


def test_a_valid_request_is_written_with_bound_parameters(stack, pipeline):
    tricky = "code = 'it''s' or code is null"  # quotes survive: no string building
    request = parse_request("execute", [T], filters={T: tricky}, surrogate_key="id")
    sent = submit(pipeline, stack.source_dsn, request, origin="dag-x-run/1")
    with psycopg.connect(stack.source_dsn) as conn:
        kind, data = conn.execute(
            "select type, data from public.debezium_signal where id = %s", (sent["signal_id"],)
        ).fetchone()
    assert kind == "execute-snapshot"
    assert sent["signal_id"].startswith("cdclake-dag-x-run-1-") and len(sent["signal_id"]) <= 64
    import json

    doc = json.loads(data)
    assert doc["additional-conditions"] == [{"data-collection": T, "filter": tricky}]
    assert "additional-condition" not in doc and doc["surrogate-key"] == "id"
    assert doc["data-collections"] == [T.replace(".", r"\.")]
