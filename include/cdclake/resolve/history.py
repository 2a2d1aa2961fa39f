"""A keyed table's history (SCD type 2): each version of each row, from a batch's decoded
changes (`json_decode.decoded`'s table) and what the history held before them.

Rules, per key in Kafka order (`cdclake.resolve.rules` decides which changes count):
- a change whose LSN is not above one already seen for its key (in the history, or
  earlier in the batch) is re-sent and adds nothing, as in the fold; a tombstone adds
  nothing, but for one after a gap (its delete was compacted away), which deletes;
- a create, update or snapshot read whose row differs from the key's open version (in the
  tracked columns: `history_columns`, else all) closes that version where it starts and
  opens its own; one that changes other columns only sets them in the open version (SCD
  type 1 for them); one whose row is the same adds nothing;
- a delete closes the open version; a truncate not re-sent (`rules.fresh_truncates`)
  closes every open version of the table, at its place in the WAL;
- a TOAST placeholder takes the previous version's value; a primary-key change's create
  takes the old key's value as of the change: its delete in the batch, else its version
  before the change in the history (`Before.as_of`), else NULL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from cdclake.debezium.schema import TopicSchema
from cdclake.resolve.rules import TOAST_PLACEHOLDER, Truncate, fresh_truncates, toastable
from cdclake.resolved import Before, Changed, Key, Version


def change_key(change: Mapping[str, Any], key_names: Sequence[str]) -> Key:
    """A decoded change's key: its Kafka key's, else its row's."""
    return tuple(
        next(
            (v for s in ("key", "after", "before") if (v := change[f"{s}__{k}"]) is not None), None
        )
        for k in key_names
    )


def moved_from(change: Mapping[str, Any], key_names: Sequence[str]) -> Key | None:
    """The key a primary-key change's create took its row from (None: not one)."""
    if not change["moved"] or change["op"] != "c":
        return None
    return tuple(change[f"from__{k}"] for k in key_names)


def lookups(
    changes: Sequence[Mapping[str, Any]], schema: TopicSchema
) -> tuple[set[Key], set[tuple[Key, int]]]:
    """What `history` needs of the history before the batch (`Before`): the batch's keys,
    and its key changes' old keys with their LSNs."""
    names = schema.key_names
    keys = {change_key(c, names) for c in changes if c["op"] != "t"}
    pointers = {(k, c["lsn"]) for c in changes if (k := moved_from(c, names)) is not None}
    return keys, pointers


def _placeholder(value: Any) -> bool:
    if isinstance(value, bytes):
        return value == TOAST_PLACEHOLDER.encode()
    if isinstance(value, list):
        return value == [TOAST_PLACEHOLDER]
    return bool(value == TOAST_PLACEHOLDER)


def history(
    changes: Sequence[Mapping[str, Any]],
    schema: TopicSchema,
    before: Before,
    tracked: Sequence[str] = (),
) -> Changed:
    """The batch's `changes` (decoded, records that cannot be applied left out) applied to
    the history as it was (`before`); `tracked`: the columns whose change opens a version
    (none: every column). See the module's rules."""
    names = schema.key_names
    ordered = sorted(changes, key=lambda c: (c["partition"], c["offset"]))
    truncates = fresh_truncates(
        (Truncate(c["partition"], c["offset"], c["lsn"]) for c in ordered if _is_truncate(c)),
        before.truncated,
    )
    by_key: dict[Key, list[Mapping[str, Any]]] = {}
    for c in ordered:
        if not _is_truncate(c) and (c["op"] is not None or c["follows_gap"]):
            by_key.setdefault(change_key(c, names), []).append(c)
    times = {
        (c["partition"], c["offset"]): int(c["ts_ms"] or 0) for c in ordered if _is_truncate(c)
    }
    pending = {k: _fresh(v, before.high.get(k)) for k, v in by_key.items()}
    run = _Run(schema, before, truncates, pending, times, tracked)
    out = Changed(truncates=[(t.lsn, times[(t.partition, t.offset)]) for t in truncates])
    while pending:  # a create waiting for its old key's change: that key goes first
        progressed = False
        for k in list(pending):
            left = run.advance(k, pending[k], stuck=False)
            progressed |= len(left) < len(pending[k])
            pending[k] = left
            if not left:
                del pending[k]
        if pending and not progressed:  # waits on each other: take what the history holds
            k = next(iter(pending))
            pending[k] = run.advance(k, pending[k], stuck=True)
            if not pending[k]:
                del pending[k]
    for k in by_key:
        run.finish(k)
    out.versions, out.earlier = run.versions, list(run.earlier.values())
    return out


def _is_truncate(c: Mapping[str, Any]) -> bool:
    return c["op"] == "t" and not c["is_tombstone"]


def _fresh(changes: list[Mapping[str, Any]], high: int | None) -> list[Mapping[str, Any]]:
    """The key's changes but re-sent ones (LSN not above one seen before it: `high` in
    the history) and tombstones (but one after a gap)."""
    out = []
    for c in changes:
        if c["is_tombstone"]:
            if c["follows_gap"]:
                out.append(c)
            continue
        lsn = c["lsn"]
        if lsn is not None and high is not None and lsn <= high:
            continue
        if lsn is not None:
            high = lsn
        out.append(c)
    return out


class _Run:
    """The keys' versions as a batch's changes are applied, key by key."""

    def __init__(
        self,
        schema: TopicSchema,
        before: Before,
        truncates: list[Truncate],
        by_key: Mapping[Key, list[Mapping[str, Any]]],
        times: Mapping[tuple[int, int], int],
        tracked: Sequence[str],
    ) -> None:
        self.schema, self.before, self.truncates = schema, before, truncates
        self.names = schema.key_names
        self.toasty = [c.name for c in toastable(schema)]
        self.open: dict[Key, Version | None] = {}
        self.passed: dict[Key, int] = {}  # the truncates each key has been closed by
        self.versions: list[Version] = []
        self._new: set[int] = set()  # ids of the batch's own versions
        self.earlier: dict[int, Version] = {}  # versions from before the batch it changed
        self.tracked = list(tracked)
        self.moved: dict[tuple[Key, int], dict[str, Any] | None] = {}  # as of a key change
        self.moving = {  # the key changes whose delete the batch applies
            (k, c["lsn"]) for k, cs in by_key.items() for c in cs if c["moved"] and c["op"] == "d"
        }
        self.ts = dict(times)  # each truncate's source time

    def _truncate_ts(self, t: Truncate) -> int:
        return self.ts[(t.partition, t.offset)]

    def _state(self, key: Key) -> Version | None:
        """The key's open version (one from before the batch: a copy, changed in place)."""
        if key not in self.open:
            latest = self.before.latest.get(key)
            if latest is not None and latest.end is None:
                self.open[key] = replace(latest, values=dict(latest.values))
            else:
                self.open[key] = None
        return self.open[key]

    def _changed(self, version: Version) -> None:
        if id(version) not in self._new:
            self.earlier[id(version)] = version

    def _close(self, key: Key, at: int, lsn: int | None) -> None:
        version = self._state(key)
        if version is None:
            return
        version.end, version.end_lsn = at, lsn
        self._changed(version)
        self.open[key] = None

    def _past_truncates(self, key: Key, change: Mapping[str, Any] | None) -> None:
        """Close the key's open version at each truncate that came before `change` (None:
        every truncate left)."""
        i = self.passed.get(key, 0)
        while i < len(self.truncates) and (change is None or _after(change, self.truncates[i])):
            t = self.truncates[i]
            self._close(key, self._truncate_ts(t), t.lsn)
            i += 1
        self.passed[key] = i

    def advance(
        self, key: Key, changes: list[Mapping[str, Any]], stuck: bool
    ) -> list[Mapping[str, Any]]:
        """Apply the key's changes in order until one waits for another key's change (not
        when `stuck`); the changes left."""
        for i, c in enumerate(changes):
            source = moved_from(c, self.names)
            pointer = (source, c["lsn"]) if source is not None else None
            if (
                pointer is not None
                and pointer in self.moving
                and pointer not in self.moved
                and not stuck
            ):
                return changes[i:]
            stuck = False
            self._past_truncates(key, c)
            self._apply(key, c, pointer)
        return []

    def finish(self, key: Key) -> None:
        self._past_truncates(key, None)

    def _apply(self, key: Key, c: Mapping[str, Any], pointer: tuple[Key, int] | None) -> None:
        op, ts = c["op"], int(c["ts_ms"] or 0)
        current = self._state(key)
        if op == "d" or op is None:  # a delete, or a tombstone after a gap
            if c["moved"] and op == "d":  # re-sent after the close: the history's as of it
                pointer = (key, c["lsn"])
                held = dict(current.values) if current else self.before.as_of.get(pointer)
                self.moved[pointer] = held
            self._close(key, ts, c["lsn"])
            return
        values = {col.name: c[f"after__{col.name}"] for col in self.schema.columns}
        if pointer is not None:
            prior = (
                self.moved.get(pointer) if pointer in self.moved else self.before.as_of.get(pointer)
            )
        else:
            prior = current.values if current is not None else None
        for name in self.toasty:
            if _placeholder(values[name]):
                values[name] = prior.get(name) if prior is not None else None
        if current is not None and self._same(current.values, values):
            if current.values != values:  # untracked columns only: taken in place
                current.values, current.updated_lsn = values, c["lsn"]
                self._changed(current)
            return
        self._close(key, ts, c["lsn"])
        version = Version(key, values, ts, c["lsn"], c["partition"], c["offset"], op)
        self.versions.append(version)
        self._new.add(id(version))
        self.open[key] = version

    def _same(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether a row is the same version: equal in the tracked columns."""
        if not self.tracked:
            return old == new
        return all(old.get(n) == new.get(n) for n in self.tracked)


def _after(change: Mapping[str, Any], t: Truncate) -> bool:
    """Whether `change` came after truncate `t`: a later LSN, or later in its partition."""
    if change["partition"] == t.partition:
        return bool(change["offset"] > t.offset)
    if change["lsn"] is not None and t.lsn is not None:
        return bool(change["lsn"] > t.lsn)
    return True
