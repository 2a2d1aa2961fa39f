"""Cutting a batch at one source transaction (`cdclake_control.consistency`): the bisection
over a partition's records and the cut's names, without Kafka."""

from __future__ import annotations

import dataclasses

import pytest
from cdclake.config import Consistency
from cdclake.debezium.formats import WireFormat
from cdclake.exceptions import ConfigError
from cdclake.iceberg.tags import cut_of, cut_tag
from cdclake.offsets import BatchPlan, Cut, Watermarks, plans_from_json
from cdclake.pipeline_file import load_pipeline
from cdclake_control.consistency import _Prober

from tests.conftest import DEMO_PIPELINE

T = "t"


class Partition(_Prober):
    """A prober of one partition whose records' transactions are given (None: a record
    outside any transaction)."""

    def __init__(self, pipeline, txids, order):
        super().__init__(pipeline)
        self.txids, self.order, self.past = txids, order, len(order)

    def _read(self, topic, partition, offset, high):
        for at in range(offset, high):
            self.reads += 1
            if self.txids[at] is not None:
                return self.order.get(self.txids[at], self.past), at
        return None


@pytest.mark.parametrize(
    "txids, last, cut",
    [
        ([10, 10, 11, 12, 12], 0, 2),  # after transaction 10's two records
        ([10, 10, 11, 12, 12], 1, 3),
        ([10, 10, 11, 12, 12], 2, 5),  # the whole partition
        ([10, None, None, 11, None], 0, 3),  # tombstones, snapshot reads: with what precedes
        ([10, None, 11, None, None], 1, 5),  # a tail outside any transaction: loaded
        ([None, None, 11], 0, 2),  # snapshot reads before a later transaction
        ([10, 99, 99], 0, 1),  # a transaction not read yet (not settled) waits
    ],
)
def test_a_partition_is_cut_after_the_last_record_of_the_chosen_transaction(
    pipeline, txids, last, cut
):
    order = {10: 0, 11: 1, 12: 2}
    with Partition(pipeline, txids, order) as prober:
        marks = {(T, 0): Watermarks(0, len(txids))}
        assert prober.cut(T, 0, 0, last, marks) == cut
        assert prober.reads <= 3 * len(txids)  # bisected, each offset read at most once


def test_a_cut_goes_through_the_plan_json_and_its_tag_names_it():
    cut = Cut(txid=781, lsn=39951784, ts_ms=1_000, after=42)
    plan = BatchPlan("demo", "b1", (), cut=cut)
    assert plans_from_json(plan.to_json())[0].cut == cut
    assert cut.describe() == "consistent as of 1970-01-01 00:00:01 UTC, LSN 39951784"
    named = cut_of(cut_tag(cut))
    assert (named.txid, named.lsn, named.ts_ms) == (781, 39951784, 1_000)
    assert cut_of("cdclake_consistent") is None and cut_of("main") is None


def test_consistency_needs_the_whole_envelope(tmp_path):
    text = DEMO_PIPELINE.read_text().replace("name: demo", "name: demo\nconsistency: transaction")
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert load_pipeline(path).consistency is Consistency.TRANSACTION
    path.write_text(text.replace("kafka:\n", "kafka:\n  format: json-flat\n", 1))
    with pytest.raises(ConfigError, match="consistency: transaction needs each change's"):
        load_pipeline(path)


def test_the_transaction_topic_defaults_to_debezium_s(pipeline):
    assert pipeline.transaction_topic == "demo.transaction"
    source = dataclasses.replace(pipeline.source, transaction_topic="other.tx")
    assert dataclasses.replace(pipeline, source=source).transaction_topic == "other.tx"
    assert WireFormat.JSON_FLAT.flat


def test_a_transaction_not_read_is_after_every_place_re_sent_ones_included(pipeline):
    """Places count END records, re-sent ones too (a connector restart), so they can
    exceed the number of transactions: an unknown transaction is after all of them."""
    order = {10: 0, 11: 5}  # 11's END came after four re-sent ones
    with Partition(pipeline, [10, 11, 99], order) as prober:
        prober.past = 6
        assert prober.cut(T, 0, 0, 5, {(T, 0): Watermarks(0, 3)}) == 2
