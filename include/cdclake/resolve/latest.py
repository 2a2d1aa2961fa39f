"""Each key's latest state, found over arrays of its changes' Kafka positions, operations
and LSNs (numpy): the CDC rules of `cdclake.resolve.rules`, written once.

In Kafka order (partition, then offset) within each key:
- a change whose LSN is not above every earlier one's is a re-send and is dropped;
- a tombstone goes with the change before it (dropped when that was dropped, or when it
  is the key's first record), but for one that follows a gap in its partition: a
  compacted topic's log cleaner removed the delete before it, and it deletes the row;
- of the kept changes, the one of highest offset gives the row (`Latest.last`); the kept
  change that is not a tombstone (`Latest.change`), the kept change with a row after
  (`Latest.after`) and the key's last create (`Latest.create`: no value of an earlier
  row of the key carries over it) are found the same way;
- a TOAST column's last real value is that of the kept change of highest offset since
  the last create whose row after holds a real value (`Latest.toast`);
- the kept records of a primary-key change (`Latest.moves`: a delete that moved its row
  to another key, or a create that took its row from one) hold the key's state as of
  them: each TOAST column's last real value before it since the create before it
  (`Latest.move_toast`), and that create (`Latest.move_create`: a create is its own;
  NONE when the key had no create before it in the records, so its state before them
  holds).

A fold can go on in steps (a range read batch by batch): `Latest.keep` names the records
the next step needs of this one (each key's winners, its last record, the one with its
highest LSN, and each record of a key change with the records its state as of it comes
from),
with what was decided of them (`Records.decided`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# what `Records.decided` says of a record: not yet decided, kept, dropped as a re-send
# (its LSN not above an earlier one's), dropped as the tombstone of a dropped change
UNDECIDED, KEPT, STALE, DROPPED = 0, 1, 2, 3
NONE = -1  # no such record
NO_LSN = np.iinfo(np.int64).min  # `Latest.lsn` of a key whose kept changes have none


@dataclass(frozen=True)
class Records:
    """One topic's changes as arrays, a record each (truncates left out): `key` numbers
    the keys 0..n-1, `real` says for each TOAST column followed whether the record's row
    after holds a real value in it (n × columns)."""

    key: np.ndarray  # int64
    partition: np.ndarray  # int64
    offset: np.ndarray  # int64
    tombstone: np.ndarray  # bool
    follows_gap: np.ndarray  # bool: records before it were removed (`raw_rows`)
    create: np.ndarray  # bool: operation `c`
    lsn: np.ndarray  # int64, 0 where `has_lsn` is false
    has_lsn: np.ndarray  # bool
    has_after: np.ndarray  # bool
    moved: np.ndarray  # bool: a record of a primary-key change (its delete or its create)
    real: np.ndarray  # bool, n × TOAST columns
    decided: np.ndarray  # int8: UNDECIDED, or what an earlier step decided

    @property
    def keys(self) -> int:
        return int(self.key.max()) + 1 if len(self.key) else 0

    def __len__(self) -> int:
        return len(self.key)


@dataclass(frozen=True)
class Latest:
    """Per key (index: its number), record indices of its winners (NONE: none)."""

    last: np.ndarray  # the kept change of highest offset: the key has a row when found
    change: np.ndarray  # the kept change (not tombstone) of highest offset
    after: np.ndarray  # the kept change with a row after, highest offset
    create: np.ndarray  # the last kept create, in Kafka order
    toast: np.ndarray  # keys × TOAST columns: the last real value's record
    lsn: np.ndarray  # the highest LSN of the kept changes (`NO_LSN` for none)
    moves: np.ndarray  # the kept records of primary-key changes
    move_toast: np.ndarray  # moves × TOAST columns: the last real value's record before it
    move_create: np.ndarray  # per move, the create its state starts from (NONE: none)
    keep: np.ndarray  # the records a next step needs, in order
    decided: np.ndarray  # what was decided of each of `keep`


def latest(records: Records) -> Latest:
    """Each key's winners among `records` (see the module's rules)."""
    n, keys = len(records.key), records.keys
    order = np.lexsort((records.offset, records.partition, records.key))
    key = records.key[order]
    first = np.ones(n, bool)
    first[1:] = key[1:] != key[:-1]
    decided = records.decided[order]
    stale = _stale(key, records.lsn[order], records.has_lsn[order], first)
    stale = np.where(decided == UNDECIDED, stale, decided == STALE)
    before_stale = np.ones(n, bool)  # a key's first tombstone follows nothing
    before_stale[1:] = stale[:-1]
    before_stale[first] = True
    tombstone = records.tombstone[order]
    dropped = np.where(tombstone, before_stale & ~records.follows_gap[order], stale)
    dropped = np.where(decided == UNDECIDED, dropped, decided != KEPT)
    kept = ~dropped
    offset = records.offset[order]
    create = _last(key, kept & records.create[order], keys)
    since_create = np.arange(n) >= create[key]  # NONE: every record
    real = records.real[order]
    toast = (
        np.stack(
            [
                _highest(key, offset, kept & since_create & real[:, j], keys)
                for j in range(real.shape[1])
            ],
            axis=1,
        )
        if real.shape[1]
        else np.zeros((keys, 0), np.int64)
    )
    winners = {
        "last": _highest(key, offset, kept, keys),
        "change": _highest(key, offset, kept & ~tombstone, keys),
        "after": _highest(key, offset, kept & records.has_after[order], keys),
        "create": create,
    }
    lsn, has_lsn = np.full(keys, NO_LSN), records.has_lsn[order]
    with_lsn = np.flatnonzero(kept & has_lsn)
    np.maximum.at(lsn, key[with_lsn], records.lsn[order][with_lsn])
    # each key's record of highest LSN: what later records' re-send check compares with
    top = _highest(key, np.where(has_lsn, records.lsn[order], 0), has_lsn, keys)
    ends = np.flatnonzero(np.r_[first[1:], True]) if n else np.zeros(0, np.int64)
    moves, move_toast, move_create = _as_of_moves(
        key, first, kept & records.moved[order], kept & records.create[order], kept, real
    )
    needed = np.concatenate(
        [*winners.values(), toast.ravel(), top, ends, moves, move_toast.ravel(), move_create]
    )
    marked = np.zeros(n, bool)
    marked[needed[needed != NONE]] = True
    keep = np.flatnonzero(marked)
    state = np.where(kept, KEPT, np.where(tombstone, DROPPED, STALE)).astype(np.int8)
    ahead = np.argsort(order[keep])  # the kept records in the caller's order
    return Latest(
        **{k: _mapped(v, order) for k, v in winners.items()},
        toast=_mapped(toast, order),
        lsn=lsn,
        moves=order[moves],
        move_toast=_mapped(move_toast, order),
        move_create=_mapped(move_create, order),
        keep=order[keep][ahead],
        decided=state[keep][ahead],
    )


def _as_of_moves(
    key: np.ndarray,
    first: np.ndarray,
    moved: np.ndarray,
    create: np.ndarray,
    kept: np.ndarray,
    real: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the positions (key order) of the key changes' records, per move and TOAST column
    the position of the last kept real value before it since the last kept create before
    it, and that create's position; NONE for none)."""
    n = len(key)
    moves = np.flatnonzero(moved)
    if not len(moves):
        return moves, np.zeros((0, real.shape[1]), np.int64), moves
    at = np.arange(n)
    # where each record's state starts: its key's last create up to it, or its first record
    start = np.maximum.accumulate(np.where(first | create, at, NONE)) if n else at
    holders = np.zeros((len(moves), real.shape[1]), np.int64)
    for j in range(real.shape[1]):
        last = np.maximum.accumulate(np.where(kept & real[:, j], at, NONE))
        holders[:, j] = np.where(last[moves] >= start[moves], last[moves], NONE)
    begin = start[moves]
    return moves, holders, np.where(create[begin], begin, NONE)


def _mapped(positions: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Positions in key order as the caller's record indices (NONE stays)."""
    return np.where(positions == NONE, NONE, order[np.maximum(positions, 0)])


def _stale(key: np.ndarray, lsn: np.ndarray, has_lsn: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Whether each record's LSN is not above an earlier one's of its key (records in key
    order): the running highest LSN of each key, its LSNs offset above every earlier
    key's (as ranks when their span is too wide for that)."""
    n = len(key)
    if not has_lsn.any():
        return np.zeros(n, bool)
    low = int(lsn[has_lsn].min())
    span = int(lsn[has_lsn].max()) - low + 2
    if span * (int(key[-1]) + 1) < 2**62:
        rank = np.where(has_lsn, lsn - low + 1, 0)
    else:
        rank = np.zeros(n, np.int64)
        rank[has_lsn] = np.unique(lsn[has_lsn], return_inverse=True)[1] + 1
        span = int(rank.max()) + 1
    running = np.maximum.accumulate(key * span + rank) - key * span
    seen = np.zeros(n, np.int64)  # the highest before each record, 0: none
    seen[1:] = running[:-1]
    seen[first] = 0
    out: np.ndarray = has_lsn & (seen > 0) & (rank <= seen)
    return out


def _highest(key: np.ndarray, offset: np.ndarray, mask: np.ndarray, keys: int) -> np.ndarray:
    """Per key, the position (key order) of the masked record of highest offset, the
    first of equal ones; NONE for a key with none."""
    out = np.full(keys, NONE)
    at = np.flatnonzero(mask)
    if not len(at):
        return out
    owner = key[at]  # positions are in key order: each key's are together
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    offsets = offset[at]
    top = np.maximum.reduceat(offsets, starts)
    lengths = np.diff(np.r_[starts, len(at)])
    first = np.where(offsets == np.repeat(top, lengths), at, np.iinfo(np.int64).max)
    out[owner[starts]] = np.minimum.reduceat(first, starts)
    return out


def _last(key: np.ndarray, mask: np.ndarray, keys: int) -> np.ndarray:
    """Per key, the position of its last masked record in key order (NONE: none)."""
    out = np.full(keys, NONE)
    at = np.flatnonzero(mask)
    last = np.r_[key[at][1:] != key[at][:-1], True] if len(at) else at.astype(bool)
    out[key[at][last]] = at[last]
    return out
