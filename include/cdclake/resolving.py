"""A topic's changes resolved where they were read (`placement`): range by range, or in
the driver; the same rules either way (`arrow_fold`). Records that cannot be applied
fail the table or go to the dead letters."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from cdclake.batch import Batch
from cdclake.config import OnError, TableConfig
from cdclake.debezium.schema import TopicSchema
from cdclake.exceptions import DecodeError
from cdclake.kafka.reader import arrow_frame, read_local, slice_ranges
from cdclake.offsets import OffsetRange
from cdclake.placement import Placement
from cdclake.resolve.fold import resolve_rows
from cdclake.resolved import Resolved

HISTORY_READ_BYTES = 1 << 30  # a slice's raw records the history's read holds at most
# what the history reads of each change beside its row after and its key
HISTORY_FIELDS = (
    *("partition", "offset", "is_tombstone", "follows_gap", "op", "ts_ms", "lsn", "moved"),
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from cdclake.ranged import RangedTopic


def resolve_table(
    batch: Batch,
    topic: str,
    table: TableConfig,
    schema: TopicSchema,
    schemas: dict[str, list[tuple[int, str]]],
    cut: int | None,
) -> Resolved:
    """The topic's changes resolved where they were read: range by range, or in the
    driver (`schemas`: the schema versions of its records not set aside). `cut`: the LSN
    of the last truncate the table applied (a truncate not above it is re-sent)."""
    # not a failed topic: its table's load raised its error before (`job._load`)
    ranged = cast("RangedTopic | None", batch.ranged.get(topic))
    if ranged is not None:
        got = ranged.accepted
        dead = _bad_records(batch, topic, table, list(got.bad), ranged.set_aside)
        return Resolved(
            ranged.rows,
            got.truncate,
            got.counts,
            got.max_source_ms,
            got.toast,
            Placement.RANGES,
            dead,
        )
    # read by the driver
    rows = _kept(cast("pa.Table", batch.rows), topic, schemas)
    done = resolve_rows(
        rows, schema, dict(schemas.get("key", [])), dict(schemas.get("value", [])), cut
    )
    dead = _bad_records(batch, topic, table, list(done.bad))
    frame = arrow_frame(batch.spark, done.rows, done.ddl)
    return Resolved(
        frame,
        done.truncate,
        done.counts,
        done.max_source_ms,
        done.toast,
        Placement.DRIVER,
        dead,
        changes=done.changes if table.history else None,
    )


def _kept(rows: pa.Table, topic: str, schemas: dict[str, list[tuple[int, str]]]) -> pa.Table:
    """The raw rows of the topic's envelopes of the schemas kept (`schemas`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keep = pc.and_(pc.equal(rows["topic"], topic), pc.is_null(rows["error"]))
    for side in ("key", "value"):
        ids = rows[f"{side}_schema_id"]
        kept = pa.array([sid for sid, _ in schemas.get(side, [])], ids.type)
        keep = pc.and_(keep, pc.or_(pc.is_null(ids), pc.is_in(ids, kept)))
    return rows.filter(keep)


def history_changes(
    batch: Batch,
    topic: str,
    schema: TopicSchema,
    schemas: dict[str, list[tuple[int, str]]],
    resolved: Resolved,
) -> list[dict[str, Any]]:
    """Every decoded change of the topic in the batch (records that cannot be applied left
    out), for its history (`cdclake.iceberg.history`): those the driver decoded for the
    table's resolve (`resolved`), or read again slice by slice in the driver when the batch
    was read range by range."""
    wanted = [*HISTORY_FIELDS, *(f"after__{c.name}" for c in schema.columns)]
    wanted += [f"{side}__{k}" for k in schema.key_names for side in ("key", "before", "from")]
    if batch.rows is not None:
        parts: Iterable[pa.Table | None] = [resolved.changes]
    else:
        ranges = [r for r in batch.plan.ranges if r.topic == topic]
        parts = (_decoded(batch, topic, schema, schemas, r) for r in slice_ranges(ranges))
    out: list[dict[str, Any]] = []
    for changes in parts:
        if changes is not None:
            out += changes.select(wanted).to_pylist()
    return out


def _decoded(
    batch: Batch,
    topic: str,
    schema: TopicSchema,
    schemas: dict[str, list[tuple[int, str]]],
    part: OffsetRange,
) -> pa.Table | None:
    """The decoded changes of a slice of the topic's records, read again in the driver
    (records that cannot be applied left out)."""
    import pyarrow.compute as pc

    from cdclake.debezium.json_decode import decoded

    rows = read_local(batch.pipeline.kafka, [part], max_bytes=HISTORY_READ_BYTES, source=batch.read)
    if rows is None:
        raise DecodeError(
            f"{topic}: a slice of the batch holds more than {HISTORY_READ_BYTES >> 20} MiB "
            "of records, more than the history's read takes; lower max_records_per_batch"
        )
    keys, values = dict(schemas.get("key", [])), dict(schemas.get("value", []))
    changes = decoded(_kept(rows, topic, schemas), schema, keys, values)
    return None if changes is None else changes.filter(pc.is_null(changes["reason"]))


def _bad_records(
    batch: Batch,
    topic: str,
    table: TableConfig,
    bad: list[tuple[int, int, str]],
    rows: Callable[[], DataFrame] | None = None,
) -> int:
    """Records that cannot be applied ((partition, offset, reason), in Kafka order): fail
    the table naming the first, or set them all aside (`on_error`; `rows`: a function
    giving them as the dead letters take them); how many were."""
    if not bad:
        return 0
    if batch.pipeline.on_error is not OnError.DEAD_LETTER:
        partition, offset, reason = bad[0]
        raise DecodeError(
            f"{topic} partition {partition} offset {offset}: {reason}. Nothing of this batch "
            f"was written to {batch.pipeline.qualified_target(table)}; {len(bad)} record(s) "
            "cannot be applied. To go on, set on_error: dead_letter (they are set aside)."
        )
    if rows is not None:
        return batch.dead_letters(rows(), len(bad))
    frame = batch.spark.createDataFrame(
        [(topic, p, o, None, None, why) for p, o, why in bad],
        "topic string, partition int, offset bigint, key string, value string, error string",
    )
    return batch.dead_letters(frame, len(bad))
