"""A table's load result as the Airflow task and `cdclake run` print it: JSON whose
`status` is the plain string the readers compare."""

from __future__ import annotations

import json

import pytest
from cdclake.batch import LoadStatus, TableResult


@pytest.mark.parametrize(
    "status, text",
    [(LoadStatus.COMMITTED, "committed"),  # the batch's rows and offsets committed
     (LoadStatus.ALREADY_COMMITTED, "already_committed"),  # a retry of a committed batch
     (LoadStatus.SKIPPED, "skipped")],  # nothing to write
)  # fmt: skip
def test_a_status_prints_and_serialises_as_its_string(status, text):
    result = TableResult(table="lake.ns.t", topic="pg.public.t", status=status, records=3)
    printed = json.dumps({"batch_id": "b", "tables": [result.to_dict()]}, sort_keys=True)
    assert f'"status": "{text}"' in printed
    assert json.loads(printed)["tables"][0]["status"] == text
    assert f"{result.status}" == str(result.status) == text  # logs and CLI lines
    assert LoadStatus(text) is status  # read back from the printed JSON
