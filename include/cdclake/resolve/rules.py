"""The CDC rules every resolve follows (`fold`, `ranges`), and the names
they share.

Rules (the semantics the tests pin down):
- Per key, Kafka order decides. A record whose source LSN is not above an LSN already
  seen for its key is a re-sent duplicate (Debezium is at-least-once) and is skipped; a
  tombstone shares the fate of the delete just before it, and is a no-op when that
  delete was in an earlier batch. Records without an LSN
  (incremental snapshot reads) are never skipped.
- A truncate removes every row loaded before it: records of the batch before it in its
  partition, and those whose LSN is not above its own (older changes re-sent after it),
  are dropped and the MERGE deletes table rows whose LSN is below the truncate's. One whose
  LSN is not above the last truncate the table applied, or an earlier one of the batch,
  is re-sent (a connector restart) and removes nothing.
- An unchanged TOASTed column arrives as a placeholder; it takes the last real value of
  the batch for that key, or else keeps the value already in the table. Across a
  primary-key change it takes the old key's value as of the change, wherever that is.
"""

from __future__ import annotations

from collections.abc import Iterable

from cdclake.debezium.schema import Column, TopicSchema
from cdclake.resolved import HAS_VALUES as HAS_VALUES
from cdclake.resolved import STALE_CHECK_LSN as STALE_CHECK_LSN
from cdclake.resolved import TOAST_PREFIX as TOAST_PREFIX
from cdclake.resolved import Truncate as Truncate

TRUNCATE = "t"
TOAST_PLACEHOLDER = "__debezium_unavailable_value"
TOAST_TYPES = ("string", "binary", "array<string>")  # Debezium sends a placeholder in
# with the TOAST flags, each key column's value of the key a row's key was changed from
# (`__debezium.oldkey`) and the change's LSN: a flagged column takes that key's value as
# of that change, not the table's (`cdclake.resolve.lineage`)
FROM_KEY_PREFIX = "_cdc_from_"
FROM_LSN = "_cdc_moved_lsn"
# the operations of resolved rows that are not rows of the table (`cdclake.resolve.lineage`):
# a key's values as of a delete that moved its row to another key (a primary-key change),
# at that delete's LSN; and the pointer of a create that took a row from another key
KEY_CHANGE, KEY_CREATE = "k", "n"
LINEAGE_OPS = (KEY_CHANGE, KEY_CREATE)
# a decoded change of a primary-key change: its delete (`__debezium.newkey`) or its
# create (`__debezium.oldkey`)
MOVED = "moved"


def fresh_truncates(truncates: Iterable[Truncate], applied: int | None = None) -> list[Truncate]:
    """The batch's truncates that are not re-sent, in Kafka order (offset, then
    partition). A truncate is re-sent (a connector restart) when its LSN is not above
    `applied` (the LSN of the last truncate the table applied) nor above an earlier one's
    of the batch: it removes nothing, and the rows loaded since, incremental snapshot reads
    without an LSN among them, stay."""
    out, high = [], applied
    for t in sorted(truncates, key=lambda t: (t.offset, t.partition)):
        if t.lsn is None or high is None or t.lsn > high:
            out.append(t)
            high = t.lsn if t.lsn is not None else high
    return out


def last_truncate(truncates: Iterable[Truncate], applied: int | None = None) -> Truncate | None:
    """The batch's last truncate not re-sent (`fresh_truncates`), the one every resolve
    applies."""
    fresh = fresh_truncates(truncates, applied)
    return fresh[-1] if fresh else None


def toastable(schema: TopicSchema) -> list[Column]:
    """The columns that may hold a TOAST placeholder (of a type Debezium sends one in)."""
    keys = set(schema.key_names)
    return [c for c in schema.columns if c.name not in keys and c.type in TOAST_TYPES]
