"""Big batches read and resolved in the same Spark tasks, one task per Kafka partition.

Debezium keys each record by its row's primary key, and Kafka's partitioner sends every
record of a key to one partition: all of a key's changes in a batch are then in one of
its offset ranges. So a task can read a whole range, decode its records with DuckDB
(`Tuning.fold_records` at a time: each query costs ~75 ms to plan) and fold them in steps
(`arrow_fold.fold_step`, the one resolve's), holding what the next step needs of each
key's changes only: its memory grows with the range's keys, not its records. Nothing of
the raw records is cached, scanned or shuffled; only the resolved rows leave the task. A
truncate drops what came before it in its partition, as the resolve of the whole topic
drops it. A table without a key is a changelog, a row per change: its ranges return each
read batch's rows as they are decoded (`RangeFold.drain`), holding nothing.

The driver first reads the head of the topic's ranges for its key and value schemas
(`head_schemas`): they give the lake columns, so the tasks return typed rows
(`TopicPlan.ddl`), then one summary row per range of what it met, with a hash of each of
its keys. A range that meets any other schema stops. The driver reads the summaries
(`accept`): a topic whose every range resolved, and with more than one range no key
found in two of them (a repartitioned topic, or a producer routing records by something
else than the key), keeps its rows. With a truncate, the other partitions' ranges must
hold no change at or below its LSN, which the resolve of the whole topic would drop. Any
other topic takes the general path: its raw records are read again, cached and scanned,
and resolved in tasks over all the records of their keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from cdclake.debezium.connect import arrow_type
from cdclake.debezium.formats import Unsupported
from cdclake.debezium.schema import DELETED, TopicSchema
from cdclake.exceptions import CdclakeError
from cdclake.kafka.reader import RangeReader
from cdclake.resolve.arrow_fold import changelog_table, fold_step, resolve_table
from cdclake.resolve.fold import check_key_types
from cdclake.resolve.range_plan import KEYS_COLUMN, META_COLUMN, RangeSummary, TopicPlan
from cdclake.resolve.rows import absent, result_columns, table_rows, tally, typed_table
from cdclake.resolve.rules import Truncate

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 2_000  # resolved rows per Arrow batch a task returns


class RangeFold:
    """The records of one offset range, folded batch by batch into each key's state."""

    def __init__(self, plan: TopicPlan, partition: int) -> None:
        self.plan = plan
        self.summary = RangeSummary(plan.topic, partition)
        self.schema: TopicSchema | None = None
        self._planned = {"key": plan.key_schema, "value": plan.value_schema}
        self._texts = {side: dict([s] if s else []) for side, s in self._planned.items()}
        self._seen = {"key": False, "value": False}
        self._hashes: list = []  # each returned batch's key hashes
        # a table without a key: every change is a row (`changelog_table`), returned as
        # each read batch is decoded (`drain`), nothing held
        self.changelog = False
        self._pending: list = []
        self._held = None  # the changes a fold in steps needs (`arrow_fold.fold_step`)
        self._raw: list = []
        self._raw_rows = 0
        self._guarded(self._start)

    @property
    def reason(self) -> str | None:
        return self.summary.reason

    def add(self, raw: pa.RecordBatch) -> bool:
        """Fold the raw rows in; False once the range must take the general path."""
        if self.reason is not None:
            return False
        self.summary.records += raw.num_rows
        self._guarded(self._add, raw)
        return self.reason is None

    def _guarded(self, step, *args) -> None:
        try:
            step(*args)
        except Unsupported as why:
            self.summary.reason = str(why)
        except CdclakeError as exc:  # e.g. a schema the lake cannot take
            self.summary.reason = str(exc)

    def _add(self, raw: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        errors = raw.column(raw.schema.get_field_index("error"))
        if errors.null_count != raw.num_rows:  # not envelopes: set aside with why
            self._set_aside(raw.filter(pc.is_valid(errors)), "error")
            raw = raw.filter(pc.is_null(errors))
        for side in ("key", "value"):
            ids = raw.column(raw.schema.get_field_index(f"{side}_schema_id"))
            if ids.null_count == len(ids):
                continue
            planned = self._planned[side]
            if planned is None or pc.any(pc.not_equal(ids, planned[0])).as_py():
                raise Unsupported(f"a {side} schema other than the one read at the head of "
                                  "the topic's ranges")  # fmt: skip
            self._seen[side] = True
        if self.changelog:
            self._log(raw)
            return
        self._fold_sql(raw)

    def _fold_sql(self, raw: pa.RecordBatch | None) -> None:
        """Read batches decoded and folded once they add up to `Tuning.fold_records`, or
        at the end (None)."""
        if raw is not None:
            self._raw.append(raw)
            self._raw_rows += raw.num_rows
        if not self._raw or (raw is not None and self._raw_rows < self.plan.tuning.fold_records):
            return
        import pyarrow as pa
        import pyarrow.compute as pc

        found = self._decoded(pa.Table.from_batches(self._raw))
        self._raw, self._raw_rows = [], 0
        if found is None:
            return
        # the range's truncate so far drops what it drops of every later step
        last = self.summary.truncate
        earlier = None if last is None else Truncate(self.summary.partition, *last)
        self._held, truncate, keys = fold_step(self._held, found, self.schema, self.plan.cut,
                                               earlier)  # fmt: skip
        most = self.plan.tuning.range_keys
        if keys > most:
            raise Unsupported(f"more than {most:,} keys in one partition's range")
        if truncate is not None:
            self.summary.truncate = [truncate.offset, truncate.lsn]
            self.summary.first_lsn = None
            found = found.filter(pc.greater(found["offset"], truncate.offset))
        low, first = pc.min(found["lsn"]).as_py(), self.summary.first_lsn
        if low is not None and (first is None or low < first):
            self.summary.first_lsn = low

    def _start(self) -> None:
        self.schema = self.plan.schema
        self.changelog = not self.schema.key_names
        check_key_types(self.schema)

    def _decoded(self, raw: pa.Table) -> pa.Table | None:
        """The raw rows' changes (`json_sql.decoded`) but for the records that cannot be
        applied, which go to the summary (`_set_aside`)."""
        import pyarrow.compute as pc

        from cdclake.debezium.json_sql import decoded

        found = decoded(raw, self.schema, self._texts["key"], self._texts["value"])
        if found is not None and found["reason"].null_count != found.num_rows:
            self._set_aside(found.filter(pc.is_valid(found["reason"])), "reason")
            found = found.filter(pc.is_null(found["reason"]))
        return found

    def _set_aside(self, records, why: str) -> None:
        """Records that cannot be applied, with their reason (column `why`), into the
        summary: the driver fails the table naming the first or sets them aside."""
        self.summary.bad += zip(records["partition"].to_pylist(),
                                records["offset"].to_pylist(),
                                records[why].to_pylist(), strict=True)  # fmt: skip

    def _log(self, raw: pa.RecordBatch) -> None:
        """A table without a key: the read batch's changes as rows (`changelog_table`),
        for `drain`."""
        import pyarrow as pa

        found = self._decoded(pa.Table.from_batches([raw]))
        if found is None or not found.num_rows:
            return
        data = changelog_table(found, self.schema)
        if len(data[DELETED]):
            self._pending.append(typed_table(data, self.plan.columns()))

    def drain(self) -> Iterator[pa.RecordBatch]:
        """The rows of a table without a key decoded so far (batches of `TopicPlan.ddl`),
        counted into the summary."""
        summary = self.summary
        while self._pending:
            table = self._pending.pop(0)
            summary.max_source_ms = tally(table, summary.counts, summary.max_source_ms)
            yield from self._out(table)

    def finish(self) -> Iterator[pa.RecordBatch]:
        """The resolved rows (batches of up to `BATCH_ROWS` rows, of `TopicPlan.ddl`),
        then the summary row."""
        summary = self.summary
        if summary.reason is None and not summary.records:
            summary.reason = "no records"
        if summary.reason is None and self.changelog:
            yield from self.drain()
        if summary.reason is None:
            for side in ("key", "value"):
                if self._seen[side]:
                    setattr(summary, f"{side}_schemas", list(self._texts[side].items()))
        if summary.reason is None and not self.changelog:
            try:
                for table in self._tables():
                    summary.max_source_ms = tally(table, summary.counts,
                                                  summary.max_source_ms)  # fmt: skip
                    self._hashes.append(key_hashes(table_rows(table), self.schema.key_names))
                    yield from self._out(table)
            except Unsupported as why:
                summary.reason = str(why)
        yield from self._out(None, summary)

    def _tables(self) -> Iterator[pa.Table]:
        """The resolved rows, `BATCH_ROWS` at a time; `summary.toast` says whether they
        carry the TOAST flags (a placeholder among the changes they come from)."""
        self._fold_sql(None)
        if self._held is None:
            return
        data, _, self.summary.toast = resolve_table(self._held, self.schema)
        table = typed_table(data, result_columns(self.schema, True, self.summary.toast))
        for start in range(0, table.num_rows, BATCH_ROWS):
            yield table.slice(start, BATCH_ROWS)

    def _out(self, table: pa.Table | None,
             summary: RangeSummary | None = None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """Resolved rows (`table`, with the columns it lacks `absent`) or the summary
        row (every column of a row null) as batches of the plan's `ddl`."""
        import numpy as np
        import pyarrow as pa

        columns = self.plan.columns()
        rows = 1 if table is None else table.num_rows
        arrays = []
        for name, type_ in columns:
            if table is None:  # the summary row
                arrays.append(pa.nulls(rows, arrow_type(type_)))
            elif name in table.column_names:
                arrays.append(table.column(name))
            else:
                arrays.append(absent(name, arrow_type(type_), rows))
        if summary is None:
            arrays += [pa.nulls(rows, pa.string()), pa.nulls(rows, pa.binary())]
        else:
            hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.uint64)
            arrays += [pa.array([summary.to_json()]), pa.array([hashes.tobytes()])]
        names = [n for n, _ in columns] + [META_COLUMN, KEYS_COLUMN]
        yield from pa.Table.from_arrays(arrays, names=names).to_batches()


def key_hashes(table: pa.Table, key_names: Sequence[str]):
    """A 64-bit number for each row's key (numpy uint64): equal keys give equal numbers,
    as Spark groups them. One integer key column is its own number; other keys are
    hashed (two keys of one number make their topic take the general path, never a
    wrong row)."""
    import hashlib

    import numpy as np
    import pyarrow as pa

    columns = [table.column(n) for n in key_names]
    if (len(columns) == 1 and pa.types.is_integer(columns[0].type)
            and columns[0].null_count == 0):  # fmt: skip
        return columns[0].cast(pa.int64()).to_numpy().view(np.uint64)
    blake = hashlib.blake2b
    values = zip(*(c.to_pylist() for c in columns), strict=True)
    return np.fromiter(
        (int.from_bytes(blake(repr(k).encode(), digest_size=8).digest(), "little")
         for k in values),
        dtype=np.uint64, count=table.num_rows,
    )  # fmt: skip


def range_task(reader: RangeReader, plans: Mapping[str, TopicPlan]):
    """A `mapInArrow` function over range rows (`reader.range_plan`): each range read
    whole by `reader` and resolved (`TopicPlan.ddl`). A range that must take the general
    path stops reading at once and returns its summary only."""
    plans = dict(plans)

    def task(batches):
        for batch in batches:
            for r in batch.to_pylist():
                fold = RangeFold(plans[r["topic"]], r["partition"])
                # the rows of a table without a key come after each read batch (a range's
                # memory is one read batch's, whatever its size); a keyed fold's at `finish`
                yield from _folding(reader, r, fold)
                yield from fold.finish()

    return task


def _folding(reader: RangeReader, r: dict, fold: RangeFold) -> Iterator[pa.RecordBatch]:
    """Read the range into `fold` until it is read whole or the fold stops, returning
    what it has to return as it reads (`drain`); the reader is closed either way."""
    records = reader(r)
    try:
        for raw in records:
            going = fold.add(raw)
            yield from fold.drain()
            if not going:
                break
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
