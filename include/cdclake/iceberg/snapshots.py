"""Iceberg snapshot summaries: the committed offsets a table's history carries, and the
rows a reader sees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cdclake.exceptions import DataLossError
from cdclake.offsets import SUMMARY_OFFSETS, TopicPartition, decode_offsets


def committed_from_snapshots(summaries: Iterable[dict[str, str]]) -> dict[TopicPartition, int]:
    """Offsets of the newest snapshot (walking back from current) that carries them
    (`offsets_summary`)."""
    return offsets_in(offsets_summary(summaries))


def offsets_in(summary: Mapping[str, str]) -> dict[TopicPartition, int]:
    """The offsets a snapshot summary carries ({} when none)."""
    return decode_offsets(summary[SUMMARY_OFFSETS]) if SUMMARY_OFFSETS in summary else {}


def offsets_summary(summaries: Iterable[dict[str, str]]) -> dict[str, str]:
    """The summary of the newest snapshot (walking back from current) that carries offsets:
    the last load's commit ({} for a table none committed to).

    Maintenance commits (compaction) carry none, so the walk skips them. The summaries
    must raise `expired_ancestor_error` when the walk reaches an expired parent: "no
    offsets" is only true of a table whose whole history has none (a new table), and
    reading it from a cut history would silently reload every topic from its earliest offset.
    """
    for summary in summaries:
        if SUMMARY_OFFSETS in summary:
            return summary
    return {}


def expired_ancestor_error(table: str, snapshot_id: int, parent_id: int) -> DataLossError:
    return DataLossError(
        f"{table}: snapshot {snapshot_id}'s parent {parent_id} was expired before a snapshot "
        "carrying cdclake.offsets was found, so the committed Kafka offsets are unknown. "
        "Nothing was loaded (loading would replay every topic from its earliest offset). "
        "Recover by rebuilding the table with a backfill in rebuild mode."
    )


def live_rows(summary: Mapping[str, str]) -> int | None:
    """Rows a reader sees, from Iceberg's summary totals, without scanning the table.

    total-records counts every row in live data files; each position delete hides one of
    them (Spark's merge-on-read writes one per replaced or deleted row). Equality deletes
    may hide any number of rows, so with any of them the count is unknown (None).
    """
    if "total-records" not in summary or int(summary.get("total-equality-deletes", 0)) > 0:
        return None
    return int(summary["total-records"]) - int(summary.get("total-position-deletes", 0))
