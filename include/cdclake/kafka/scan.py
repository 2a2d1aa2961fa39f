"""The raw scan: what one pass over a batch's raw records tells before anything is decoded
(the schemas of each topic, the records that are not envelopes, which topics may hold a
truncate).

`scan_raw` is one Spark job over the raw DataFrame; `scan_rows` gives the same answer
for raw rows the driver holds (small batches, read by the driver itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class RawScan:
    """What one pass over a batch's raw records tells: per topic, the key and value
    schemas (id, text; oldest first by their last offset) of the records that split,
    and the first record that did not (partition, offset, error) with their count."""

    schemas: dict[str, dict[str, list[tuple[int, str]]]]
    broken: dict[str, tuple[int, int, str]]
    broken_count: int
    # topics with a payload that may be a truncate (`"op":"t"` in its text); the others
    # certainly have none, so their records are resolved in tasks grouped by key
    truncates: frozenset[str] = frozenset()


def scan_raw(raw, truncate_text: str) -> RawScan:
    """One Spark job for the schema collection and the broken-envelope check of every
    topic of the batch (instead of one job each)."""
    from pyspark.sql import functions as F

    sides = [
        F.struct(F.lit(side).alias("side"), F.col(f"{side}_schema_id").alias("sid"),
                 F.col(f"{side}_schema").alias("text"))
        for side in ("key", "value")
    ]  # fmt: skip
    sides.append(
        F.struct(F.lit("error").alias("side"), F.lit(None).cast("long").alias("sid"),
                 F.col("error").alias("text"))
    )  # fmt: skip
    sides.append(
        F.struct(F.lit("truncate").alias("side"), F.lit(None).cast("long").alias("sid"),
                 F.when(F.col("value_payload").rlike(truncate_text), F.lit("t")).alias("text"))
    )  # fmt: skip
    at = F.struct("partition", "offset")
    is_error = F.col("s.side") == "error"
    flagged = F.col("s.side").isin("error", "truncate") & F.col("s.text").isNotNull()
    rows = (
        raw.select("topic", "partition", "offset", "error", F.explode(F.array(*sides)).alias("s"))
        .where(F.col("s.sid").isNotNull() | flagged)
        .groupBy("topic", F.col("s.side").alias("side"), F.col("s.sid").alias("sid"))
        .agg(
            # a schema counts for the records that split; its text may come from any
            # record (the reader sends it with the first one of a task only)
            F.max(F.when(F.col("error").isNull(), at)).alias("last"),
            F.first("s.text", ignorenulls=True).alias("text"),
            F.min(F.when(is_error, F.struct("partition", "offset", F.col("s.text")))).alias(
                "first"
            ),
            F.count(F.lit(1)).alias("n"),
        )
        .collect()
    )
    schemas: dict[str, dict[str, list[tuple[int, str]]]] = {}
    broken: dict[str, tuple[int, int, str]] = {}
    broken_count = 0
    truncates = set()
    for r in sorted(rows, key=lambda r: (r["topic"], _age(r["last"]))):
        if r["side"] == "truncate":
            truncates.add(r["topic"])
        elif r["side"] == "error":
            broken[r["topic"]] = (r["first"][0], r["first"][1], r["first"][2])
            broken_count += r["n"]
        elif r["last"] is not None:
            schemas.setdefault(r["topic"], {}).setdefault(r["side"], []).append(
                (r["sid"], r["text"])
            )
    return RawScan(schemas, broken, broken_count, frozenset(truncates))


def _age(last) -> tuple[int, int]:
    """Where a schema was last used, to order a topic's schemas oldest first: by offset,
    then partition (-1 when no record that split used it)."""
    return (last["offset"], last["partition"]) if last else (-1, -1)


def scan_rows(rows: pa.Table, truncate_text: str) -> RawScan:
    """`scan_raw` of raw rows held by the driver (an Arrow table of the reader's rows)."""
    truncate = re.compile(truncate_text, re.ASCII)  # Java's \s: ASCII whitespace only
    last: dict[tuple[str, str, int], tuple[int, int]] = {}  # (partition, offset)
    texts: dict[tuple[str, str, int], str | None] = {}
    broken: dict[str, tuple[int, int, str]] = {}
    broken_count = 0
    truncates = set()
    columns = rows.drop_columns(["key_payload"]).to_pydict()
    for i, topic in enumerate(columns["topic"]):
        partition, offset = columns["partition"][i], columns["offset"][i]
        error = columns["error"][i]
        for side in ("key", "value"):
            sid = columns[f"{side}_schema_id"][i]
            if sid is None:
                continue
            group = (topic, side, sid)
            if texts.get(group) is None:
                texts[group] = columns[f"{side}_schema"][i]
            if error is None:
                last[group] = max(last.get(group, (partition, offset)), (partition, offset))
        if error is not None:
            broken_count += 1
            broken[topic] = min(broken.get(topic, (partition, offset, error)),
                                (partition, offset, error))  # fmt: skip
        payload = columns["value_payload"][i]
        if payload is not None and truncate.search(payload):
            truncates.add(topic)
    schemas: dict[str, dict[str, list[tuple[int, str]]]] = {}
    # the order of `_age`: by offset, then partition
    for topic, side, sid in sorted(last, key=lambda g: (g[0], last[g][1], last[g][0])):
        schemas.setdefault(topic, {}).setdefault(side, []).append((sid, texts[(topic, side, sid)]))
    return RawScan(schemas, broken, broken_count, frozenset(truncates))
