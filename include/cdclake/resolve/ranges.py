"""Big batches read and resolved in the same Spark tasks, one task per Kafka partition.

Debezium keys each record by its row's primary key, and Kafka's partitioner sends every
record of a key to one partition: all of a key's changes in a batch are then in one of
its offset ranges. So a task can read a whole range, decode its records with DuckDB
(`Tuning.fold_records` at a time: each query costs ~75 ms to plan) and fold them in steps
(`arrow_fold.fold_step`, the one resolve's), holding what the next step needs of each
key's changes only: its memory grows with the range's keys, not its records, and past
`Tuning.range_keys` keys the fold goes on by key hash on local disk (`spill`). Nothing
of the raw records is cached, scanned or shuffled; only the resolved rows leave the
task. A table without a key is a changelog, a row per change: its ranges return each
read batch's rows as they are decoded (`RangeFold.drain`), holding nothing.

The driver first reads the head of the topic's ranges for its key and value schemas
(`head_schemas`): they give the lake columns, so the tasks return typed rows
(`TopicPlan.ddl`), then one summary row per task of what it met, with a hash of each of
its keys. A range that meets another schema returns no row and reads on for the
schemas (`RangeSummary.unplanned`); the driver reads the ranges again with them. The
driver puts the summaries together (`accept`): with a key in two ranges, or a truncate
whose drop reaches the other partitions' ranges, the ranges are read again folded in one
task, in partition order (`range_task(..., together=True)`), as the driver's own fold
takes a small batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from cdclake.debezium.connect import arrow_type
from cdclake.debezium.schema import DELETED, TopicSchema
from cdclake.kafka.reader import RangeReader
from cdclake.resolve.arrow_fold import (
    changelog_table,
    fold_step,
    key_hashes,
    resolve_table,
    step_truncate,
)
from cdclake.resolve.range_plan import (
    BAD_COLUMN,
    BAD_TYPE,
    KEYS_COLUMN,
    META_COLUMN,
    RangeSummary,
    TopicPlan,
)
from cdclake.resolve.rows import absent, result_columns, table_rows, tally, typed_table
from cdclake.resolve.rules import Truncate
from cdclake.resolve.spill import Spill

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

BATCH_ROWS = 2_000  # resolved rows per Arrow batch a task returns


class RangeFold:
    """The records of a task's offset ranges (one range, or all of a topic's in turn),
    folded read batch by read batch into each key's state."""

    def __init__(self, plan: TopicPlan, partition: int, records: int = 0) -> None:
        self.plan = plan
        self.summary = RangeSummary(plan.topic, partition)
        self.records = records  # the offsets planned: how many buckets a spill takes
        self.schema: TopicSchema | None = plan.schema if plan.planned else None
        self._texts = {"key": dict(plan.key_schemas), "value": dict(plan.value_schemas)}
        self._aside = {(side, sid): why for side, sid, why in plan.set_aside}
        self._met: dict[str, dict[int, str]] = {"key": {}, "value": {}}
        self._unplanned: dict[str, dict[int, str]] = {"key": {}, "value": {}}
        self._hashes: list[np.ndarray] = []  # each returned batch's key hashes
        # a table without a key: every change is a row (`changelog_table`), returned as
        # each read batch is decoded (`drain`), nothing held
        self.changelog = self.schema is not None and not self.schema.key_names
        self._pending: list[pa.Table] = []
        self._bad: list[
            pa.StructArray
        ] = []  # records set aside not returned yet (`BAD_TYPE` arrays)
        self._held: pa.Table | None = (
            None  # the changes a fold in steps needs (`arrow_fold.fold_step`)
        )
        self._spill: Spill | None = None  # once they outgrow `Tuning.range_keys`
        self._raw: list[pa.RecordBatch] = []
        self._raw_rows = 0

    @property
    def _planned(self) -> TopicSchema:
        """The plan's schema: a fold starts only with it (`add`)."""
        return cast(TopicSchema, self.schema)

    @property
    def collecting(self) -> bool:
        """Whether the range met a schema its plan does not know: it returns no row and
        reads on for the schemas (`RangeSummary.unplanned`)."""
        return bool(self._unplanned["key"] or self._unplanned["value"])

    def add(self, raw: pa.RecordBatch) -> None:
        """Fold a read batch's raw rows in."""
        self.summary.records += raw.num_rows
        raw = self._known(raw)
        if self.collecting or self.schema is None:
            return
        if self.changelog:
            self._log(raw)
        else:
            self._fold_sql(raw)

    def _known(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        """The raw rows but those that cannot be applied (not envelopes, a schema version
        set aside), which go to the summary; each schema met noted (`_met`, or
        `_unplanned`, which drops what was folded)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        errors = raw.column(raw.schema.get_field_index("error"))
        if errors.null_count != raw.num_rows:  # not envelopes: set aside with why
            self._set_aside(raw.filter(pc.is_valid(errors)), "error")
            raw = raw.filter(pc.is_null(errors))
        for side in ("key", "value"):
            ids = raw.column(raw.schema.get_field_index(f"{side}_schema_id"))
            if ids.null_count == len(ids):
                continue
            for sid in pc.unique(ids.drop_null()).to_pylist():
                at = pc.equal(ids, sid)
                if (side, sid) in self._aside:
                    unfit = raw.filter(at)
                    why = pa.array([self._aside[(side, sid)]] * unfit.num_rows, pa.string())
                    self._set_aside(unfit.append_column("why", why), "why")
                elif sid in self._texts[side]:
                    self._met[side][sid] = self._texts[side][sid]
                else:
                    texts = raw.column(raw.schema.get_field_index(f"{side}_schema"))
                    first = pc.index(pc.fill_null(at, False), True).as_py()
                    self._unplanned[side].setdefault(sid, texts[first].as_py())
            aside = [sid for s, sid in self._aside if s == side]
            if aside:
                raw = raw.filter(
                    pc.invert(pc.fill_null(pc.is_in(ids, pa.array(aside, ids.type)), False))
                )
        if self.collecting:
            self._held = self._spill = None
            self._raw, self._pending = [], []
        return raw

    def _truncate(self) -> Truncate | None:
        last = self.summary.truncate
        return None if last is None else Truncate(*last)

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
        # the truncate so far drops what it drops of every later step
        earlier, cut = self._truncate(), self.plan.cut
        if self._spill is None:
            self._held, truncate, keys = fold_step(self._held, found, self._planned, cut, earlier)
            tuning = self.plan.tuning
            if keys > tuning.range_keys:  # on local disk by key from now on
                self._spill = Spill(self._planned, -(-self.records // tuning.range_keys))
                self._spill.add(self._held)
                self._held = None
        else:
            truncate = step_truncate(found, cut, earlier)
            self._spill.add(found)
        if truncate is not None:
            self.summary.truncate = [truncate.partition, truncate.offset, truncate.lsn]
            self.summary.first_lsn = None
            before = pc.and_(
                pc.equal(found["partition"], truncate.partition),
                pc.less_equal(found["offset"], truncate.offset),
            )
            found = found.filter(pc.invert(before))
        low, first = pc.min(found["lsn"]).as_py(), self.summary.first_lsn
        if low is not None and (first is None or low < first):
            self.summary.first_lsn = low

    def _decoded(self, raw: pa.Table) -> pa.Table | None:
        """The raw rows' changes (`json_decode.decoded`) but for the records that cannot be
        applied, which go to the summary (`_set_aside`)."""
        import pyarrow.compute as pc

        from cdclake.debezium.json_decode import decoded

        found = decoded(raw, self._planned, self._texts["key"], self._texts["value"])
        if found is not None and found["reason"].null_count != found.num_rows:
            self._set_aside(found.filter(pc.is_valid(found["reason"])), "reason")
            found = found.filter(pc.is_null(found["reason"]))
        return found

    def _set_aside(self, records: pa.Table | pa.RecordBatch, why: str) -> None:
        """Records that cannot be applied, with their reason (column `why`), into the
        summary (the driver fails the table naming the first or sets them aside) and, as
        rows of `BAD_COLUMN`, with their payloads when they are raw rows."""
        import pyarrow as pa

        self.summary.bad += zip(
            records["partition"].to_pylist(),
            records["offset"].to_pylist(),
            records[why].to_pylist(),
            strict=True,
        )
        kind = arrow_type(BAD_TYPE)
        names = {"key": "key_payload", "value": "value_payload", "reason": why}
        fields = []
        for field in kind:
            name = names.get(field.name, field.name)
            column = (
                records[name]
                if name in records.schema.names
                else pa.nulls(records.num_rows, field.type)
            )
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            fields.append(column.cast(field.type))
        self._bad.append(pa.StructArray.from_arrays(fields, fields=list(kind)))

    def _log(self, raw: pa.RecordBatch) -> None:
        """A table without a key: the read batch's changes as rows (`changelog_table`),
        for `drain`."""
        import pyarrow as pa

        found = self._decoded(pa.Table.from_batches([raw]))
        if found is None or not found.num_rows:
            return
        data = changelog_table(found, self._planned)
        if len(data[DELETED]):
            self._pending.append(typed_table(data, self.plan.columns()))

    def drain(self) -> Iterator[pa.RecordBatch]:
        """The records set aside so far, and the rows of a table without a key decoded
        so far (batches of `TopicPlan.ddl`), counted into the summary."""
        while self._bad:
            yield from self._out(None, bad=self._bad.pop(0))
        summary = self.summary
        while self._pending:
            table = self._pending.pop(0)
            summary.max_source_ms = tally(table, summary.counts, summary.max_source_ms)
            yield from self._out(table)

    def finish(self) -> Iterator[pa.RecordBatch]:
        """The resolved rows (batches of up to `BATCH_ROWS` rows, of `TopicPlan.ddl`),
        then the summary row; only the summary when the range met unplanned schemas."""
        summary = self.summary
        summary.unplanned = {
            side: list(found.items()) for side, found in self._unplanned.items() if found
        }
        if not summary.unplanned:
            summary.key_schemas = list(self._met["key"].items())
            summary.value_schemas = list(self._met["value"].items())
            self._fold_sql(None)
            yield from self.drain()
            if not self.changelog and self.schema is not None:
                for table in self._tables():
                    summary.max_source_ms = tally(table, summary.counts, summary.max_source_ms)
                    self._hashes.append(key_hashes(table_rows(table), self.schema.key_names))
                    yield from self._out(table)
        yield from self._out(None, summary)

    def close(self) -> None:
        """Remove what the fold spilled to disk, if anything."""
        if self._spill is not None:
            self._spill.close()

    def _tables(self) -> Iterator[pa.Table]:
        """The resolved rows, `BATCH_ROWS` at a time (a spilled fold's a bucket at a
        time); `summary.toast` says whether they carry the TOAST flags (a placeholder
        among the changes they come from; `finish` folded the last read batches)."""
        held: Iterable[pa.Table]
        if self._spill is not None:
            held = self._spill.folds(self.plan.cut, self._truncate())
        else:
            held = [] if self._held is None else [self._held]
        for changes in held:
            data, _, toast = resolve_table(changes, self._planned)
            self.summary.toast |= toast
            table = typed_table(data, result_columns(self._planned, True, toast))
            for start in range(0, table.num_rows, BATCH_ROWS):
                yield table.slice(start, BATCH_ROWS)

    def _out(
        self,
        table: pa.Table | None,
        summary: RangeSummary | None = None,
        bad: pa.StructArray | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Resolved rows (`table`, with the columns it lacks `absent`), the summary row,
        or rows of records set aside (`bad`, of `BAD_TYPE`; the other columns of such a
        row null) as batches of the plan's `ddl`."""
        import numpy as np
        import pyarrow as pa

        columns = self.plan.columns()
        rows = table.num_rows if table is not None else len(bad) if bad is not None else 1
        arrays = []
        for name, type_ in columns:
            if table is None:
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
        arrays.append(bad if bad is not None else pa.nulls(rows, arrow_type(BAD_TYPE)))
        names = [n for n, _ in columns] + [META_COLUMN, KEYS_COLUMN, BAD_COLUMN]
        yield from pa.Table.from_arrays(arrays, names=names).to_batches()


def range_task(
    reader: RangeReader, plans: Mapping[str, TopicPlan], together: bool = False
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function over range rows (`reader.range_plan`): each range read
    whole by `reader` and resolved (`TopicPlan.ddl`), or with `together` a task's ranges
    (a topic's) folded as one, in partition order."""
    plans = dict(plans)

    def task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ranges = [r for batch in batches for r in batch.to_pylist()]
        if together:
            groups = [sorted(ranges, key=lambda r: (r["partition"], r["start"]))]
        else:
            groups = [[r] for r in ranges]
        for group in groups:
            if not group:
                continue
            first = group[0]
            fold = RangeFold(
                plans[first["topic"]], first["partition"], sum(r["end"] - r["start"] for r in group)
            )
            try:
                # the rows of a table without a key come after each read batch (a
                # range's memory is one read batch's, whatever its size); a keyed fold's
                # at `finish`
                for r in group:
                    yield from _folding(reader, r, fold)
                yield from fold.finish()
            finally:
                fold.close()

    return task


def _folding(reader: RangeReader, r: dict[str, Any], fold: RangeFold) -> Iterator[pa.RecordBatch]:
    """Read the range into `fold`, returning what it has to return as it reads
    (`drain`); the reader is closed either way."""
    records = reader(r)
    try:
        for raw in records:
            fold.add(raw)
            yield from fold.drain()
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
