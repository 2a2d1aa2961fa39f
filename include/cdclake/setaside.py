"""Records a table cannot take: records that are not envelopes, schema versions that do not
fit the table; they fail their table naming topic, partition and offset, or go to the dead
letters with the record as Kafka held it."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Protocol, cast

from cdclake.config import OnError, PipelineConfig, TableConfig
from cdclake.debezium.formats import WireFormat
from cdclake.debezium.schema import column_types, misfit
from cdclake.exceptions import DecodeError
from cdclake.iceberg.deadletters import set_aside
from cdclake.kafka.scan import RawScan
from cdclake.offsets import BatchPlan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)


class Misfitting(Protocol):
    """What setting a table's misfits aside needs of its batch (`cdclake.batch.Batch` holds
    it): the pipeline, and the dead letters' writer."""

    pipeline: PipelineConfig

    def dead_letters(self, rows: DataFrame, count: int) -> int: ...


def handle_broken_envelopes(
    spark: SparkSession, pipeline: PipelineConfig, plan: BatchPlan, raw: DataFrame, scan: RawScan
) -> tuple[DataFrame, RawScan, dict[str, int]]:
    """Records that are not JSON-with-schema envelopes: dead-letter them (and take them
    out of the batch; their count per topic is returned), or leave them in `scan.broken`
    to fail their tables."""
    from pyspark.sql import functions as F

    if pipeline.on_error is not OnError.DEAD_LETTER or not scan.broken_count:
        return raw, scan, {}
    dead = _dead_letter_rows(raw.where(F.col("error").isNotNull()), F.col("error"))
    set_aside(spark, pipeline, plan, dead, scan.broken_count)
    kept = dataclasses.replace(scan, broken={}, broken_counts={})
    return raw.where(F.col("error").isNull()), kept, dict(scan.broken_counts)


def set_aside_misfits(
    batch: Misfitting,
    table: TableConfig,
    topic: str,
    schemas: dict[str, list[tuple[int, str]]],
    known: dict[str, str],
    raw: DataFrame | None,
) -> tuple[dict[str, list[tuple[int, str]]], DataFrame | None, int]:
    """Records whose schema version does not fit the table's columns (an incompatible
    type change in the source, e.g. text -> integer): fail naming the first of them, or
    dead-letter them all and go on with the rest. Returns the schemas and records left,
    and how many were set aside."""
    from pyspark.sql import functions as F

    rejected = misfits(table, topic, schemas, known, batch.pipeline.kafka.format)
    if not rejected:
        return schemas, raw, 0
    reason: Column | None = None
    for (side, sid), text in rejected.items():
        cond = F.col(f"{side}_schema_id") == F.lit(sid)
        reason = F.when(cond, F.lit(text)) if reason is None else reason.when(cond, F.lit(text))
    # `raw` is None only for a ranged topic, whose ranges set its misfits aside already;
    # `reason` is not None: `rejected` is not empty
    marked = cast("DataFrame", raw).withColumn("_misfit", cast("Column", reason))
    unfit = marked.where(F.col("_misfit").isNotNull())
    if batch.pipeline.on_error is OnError.DEAD_LETTER:
        dead = _dead_letter_rows(unfit, F.col("_misfit"))
        count = batch.dead_letters(dead, dead.count())
        left = {
            side: [(sid, t) for sid, t in versions if (side, sid) not in rejected]
            for side, versions in schemas.items()
        }
        return left, marked.where(F.col("_misfit").isNull()).drop("_misfit"), count
    first = unfit.orderBy("partition", "offset").limit(1).collect()[0]
    target = batch.pipeline.qualified_target(table)
    if first._misfit.startswith(NOT_READABLE):
        go_on = (
            "set kafka.format to what the connector writes, or on_error: dead_letter "
            "(these records are set aside)."
        )
    else:
        go_on = (
            "set on_error: dead_letter (these records are set aside), or take the new "
            "type: drop the column from the lake table, load (records of the old type in "
            "the same batch are set aside or fail), and run an incremental snapshot of the "
            "table."
        )
    raise DecodeError(
        f"{topic} partition {first.partition} offset {first.offset}: {first._misfit}. "
        f"Nothing of this batch was written to {target}. To go on, {go_on}"
    )


def _dead_letter_rows(raw: DataFrame, error: Column) -> DataFrame:
    """Raw rows as `set_aside` takes them: the record's place, its payloads and `error`."""
    from pyspark.sql import functions as F

    return raw.select(
        "topic",
        "partition",
        "offset",
        F.col("key_payload").alias("key"),
        F.col("value_payload").alias("value"),
        error.alias("error"),
    )


# the start of the reason of a value schema that is not of the pipeline's format (e.g. a
# record flattened by ExtractNewRecordState in a `json` pipeline, or written to the topic
# by something else); the format's own message follows
NOT_READABLE = "not readable as kafka.format"


def misfits(
    table: TableConfig,
    topic: str,
    schemas: dict[str, list[tuple[int, str]]],
    known: dict[str, str],
    fmt: WireFormat,
) -> dict[tuple[str, int], str]:
    """(side, schema id) -> why that schema version (its text in `fmt`) does not fit the
    table's columns."""
    codec = fmt.codec
    rejected: dict[tuple[str, int], str] = {}
    for sid, text in schemas.get("value", []):
        try:
            codec.value_fields(text, topic)
        except DecodeError as exc:
            why = str(exc).removeprefix(f"{topic}: ")
            rejected[("value", sid)] = f"{NOT_READABLE} {fmt.value}: {why}"
    for side in ("key", "value") if not table.key else ("value",):
        versions = [
            (sid, codec.value_fields(text, topic) if side == "value" else codec.key_fields(text))
            for sid, text in schemas.get(side, [])
            if (side, sid) not in rejected
        ]
        exclude = table.exclude if side == "value" else ()
        types = column_types([f for _, f in versions], known, exclude)
        for sid, fields in versions:
            if (reason := misfit(fields, types, exclude)) is not None:
                rejected[(side, sid)] = reason
    return rejected
