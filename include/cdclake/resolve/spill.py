"""A range's fold that outgrows memory: once it holds more keys than `Tuning.range_keys`
(an initial snapshot: every record a new key), what it holds and every later step's
decoded changes are written to local disk by key hash, a bucket each, and each bucket
is folded alone at the end (`arrow_fold.fold_step`, over its steps in the order they
were read): a key's changes all land in one bucket, so each bucket's fold is the range's
fold of its keys, and a task holds one bucket at a time."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cdclake.debezium.schema import TopicSchema
from cdclake.resolve.arrow_fold import change_keys, fold_step, key_hashes
from cdclake.resolve.rules import TRUNCATE, Truncate

if TYPE_CHECKING:
    import pyarrow as pa


class Spill:
    """Decoded changes (and a fold's held changes, written first) in `buckets` buckets on
    local disk (Spark's local directory), a file per bucket and step."""

    def __init__(self, schema: TopicSchema, buckets: int) -> None:
        local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
        self.schema = schema
        self.dir = tempfile.mkdtemp(prefix="cdclake-fold-", dir=local)
        self.files: list[list[str]] = [[] for _ in range(max(2, buckets))]
        self._steps = 0

    def add(self, changes: pa.Table) -> None:
        """Write the changes (truncates left out: the fold is handed the last one) to
        their keys' buckets."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        truncates = pc.fill_null(pc.equal(changes["op"], TRUNCATE), False)
        changes = changes.filter(pc.invert(truncates))
        if not changes.num_rows:
            return
        keys = change_keys(changes, self.schema)
        names = list(self.schema.key_names)
        hashes = key_hashes(pa.table(dict(zip(names, keys, strict=True))), names)
        bucket = hashes % np.uint64(len(self.files))
        self._steps += 1
        for b, paths in enumerate(self.files):
            part = changes.filter(pa.array(bucket == b))
            if not part.num_rows:
                continue
            path = os.path.join(self.dir, f"{b}-{self._steps}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, part.schema) as out:
                out.write_table(part)
            paths.append(path)

    def folds(self, cut: int | None, truncate: Truncate | None) -> Iterator[pa.Table]:
        """Each bucket's held changes: its files (the first may hold what the fold held,
        with what was decided of it) folded in one step (`fold_step`; `cut`: the LSN of
        the table's last truncate, `truncate`: the range's last), a bucket at a time."""
        import pyarrow as pa

        for paths in self.files:
            if not paths:
                continue
            steps = []
            for path in paths:
                with pa.OSFile(path, "rb") as source:
                    steps.append(pa.ipc.open_file(source).read_all())
                os.remove(path)
            changes = pa.concat_tables(steps, promote_options="permissive")
            del steps
            held, _, _ = fold_step(None, changes, self.schema, cut, truncate)
            yield held

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
