"""The resolve (`cdclake.resolve.fold`) run in Spark tasks, for a batch the driver did not
read: each task takes all the records of some keys and returns their resolved rows, then
one row that reports what else it found (`task_report`), which the driver adds up
(`TaskReports`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cdclake.debezium.connect import arrow_type
from cdclake.debezium.schema import TopicSchema
from cdclake.resolve.fold import TopicResolved, resolve_rows
from cdclake.resolve.rows import result_columns, typed_table
from cdclake.resolve.rules import TOAST_PREFIX, Truncate, last_truncate

RAW_COLUMNS = ("partition", "offset", "is_tombstone", "follows_gap", "key_schema_id",
               "key_payload", "value_schema_id", "value_payload", "headers")  # fmt: skip
TASK_RECORDS = 50_000  # records of one topic per resolving task (on average)
# a column of what `resolve_task` returns: NULL on a resolved row; on each task's last row,
# what its resolve found besides its rows (`task_report`)
REASON = "_cdc_reason"


def grouped_by_kafka_key(schema: TopicSchema, key_schemas: Mapping[int, str], table_key) -> bool:
    """Whether all the records of a key in the batch have the same Kafka key text: the
    key is the Kafka key (not a configured one) and has one schema in the batch."""
    return bool(schema.key_names) and not table_key and len(key_schemas) == 1


def resolve_task(schema: TopicSchema, key_schemas: Mapping[int, str],
                 value_schemas: Mapping[int, str], cut: int | None = None):  # fmt: skip
    """A `mapInArrow` function: the raw records of some keys (all of each key's records
    in the batch) -> their resolved rows (`task_columns`: a keyed table's with the TOAST
    flags, False where the task met no placeholder), then a row that reports the rest
    (`REASON`: `task_report`). `cut`: the LSN of the last truncate the table applied."""
    key_schemas, value_schemas = dict(key_schemas), dict(value_schemas)
    columns = task_columns(schema)

    def task(batches):
        import pyarrow as pa

        parts = [b for b in batches if b.num_rows]
        if not parts:
            return
        done = resolve_rows(pa.Table.from_batches(parts), schema, key_schemas, value_schemas,
                            cut)  # fmt: skip
        rows = done.rows
        arrays = [rows[name] if name in rows.column_names
                  else pa.array([False] * rows.num_rows, pa.bool_())
                  if name.startswith(TOAST_PREFIX)  # a TOAST flag
                  else pa.nulls(rows.num_rows, arrow_type(type_))
                  for name, type_ in columns]  # fmt: skip
        yield from pa.Table.from_arrays(arrays, names=[n for n, _ in columns]).to_batches()
        report = {REASON: pa.array([task_report(done)], pa.string())}
        yield from typed_table(report, columns).to_batches()

    return task


def task_columns(schema: TopicSchema) -> list[tuple[str, str]]:
    """(name, Spark type) of what `resolve_task` returns."""
    keyed = bool(schema.key_names)
    return [*result_columns(schema, keyed, keyed), (REASON, "string")]


def task_report(done: TopicResolved) -> str:
    """What a task's resolve found besides its rows, as JSON: see `TaskReports`."""
    t = done.truncate
    last = None if t is None else [t.partition, t.offset, t.lsn]
    return json.dumps({"counts": [done.counts.get(False, 0), done.counts.get(True, 0)],
                       "max_ms": done.max_source_ms, "toast": done.toast, "bad": done.bad,
                       "truncate": last})  # fmt: skip


@dataclass(frozen=True)
class TaskReports:
    """The tasks' reports (`task_report`) added up: the rows per deleted flag, the latest
    source time, whether a task left a placeholder, the records that cannot be applied
    (in Kafka order) and the last truncate."""

    counts: dict[bool, int]
    max_source_ms: int | None
    toast: bool
    bad: list[tuple[int, int, str]]
    truncate: Truncate | None

    @classmethod
    def of(cls, texts: Iterable[str]) -> TaskReports:
        found = [json.loads(t) for t in texts]
        alive, deleted = (sum(r["counts"][i] for r in found) for i in (0, 1))
        counts = {flag: n for flag, n in ((False, alive), (True, deleted)) if n}
        latest = [r["max_ms"] for r in found if r["max_ms"] is not None]
        bad = sorted((p, o, why) for r in found for p, o, why in r["bad"])
        truncates = [Truncate(*r["truncate"]) for r in found if r["truncate"]]
        return cls(counts, max(latest, default=None), any(r["toast"] for r in found), bad,
                   last_truncate(truncates))  # fmt: skip
