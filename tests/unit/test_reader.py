import pytest
from cdclake.kafka.reader import slice_ranges
from cdclake.offsets import OffsetRange
from cdclake.raw_rows import schema_id, split_envelope


@pytest.mark.parametrize(
    "record, schema, payload",
    [
        (b'{"schema":{"type":"int32"},"payload":5}', b'{"type":"int32"}', b"5"),
        # a payload that itself contains the separator text is split at the first one
        (
            b'{"schema":{"a":1},"payload":{"x":",\\"payload\\":"}}',
            b'{"a":1}',
            b'{"x":",\\"payload\\":"}',
        ),
        (b'{"schema":{"type":"struct"},"payload":null}', b'{"type":"struct"}', b"null"),
        # any other valid JSON is parsed: whitespace, the payload first
        (b'{ "schema" : {"type": "int32"},\n "payload" : 5 }', b'{"type":"int32"}', b"5"),
        (b'{"payload":{"a":"\xc3\xa9"},"schema":{"a":1}}', b'{"a":1}', b'{"a":"\xc3\xa9"}'),
        (b'{"schema":{"a":1},"payload" :{"x":1.5e300}}', b'{"a":1}', b'{"x":1.5e+300}'),
    ],
)
def test_split_envelope(record, schema, payload):
    assert split_envelope(record) == (schema, payload)


@pytest.mark.parametrize(
    "record", [b'{"schema":null,"payload":null}', b'{"payload": null, "schema": null}']
)
def test_a_null_schema_and_payload_is_the_converters_null_value(record):
    from cdclake.raw_rows import SchemaIds, record_row

    assert split_envelope(record) is None
    row = record_row(SchemaIds(), "t", 0, 7, 0, b'{"schema":{"a":1},"payload":{"id":1}}', record)
    assert row["is_tombstone"] and row["value_payload"] is None and row["error"] is None
    assert row["key_payload"] == '{"id":1}'


@pytest.mark.parametrize(
    "record",
    [
        b'{"id": 1}',  # schemas disabled in the converter
        b"\x00\x01garbage",  # not JSON at all
        b'{"schema":{"type":"int32"}}',  # no payload
        b'{"schema":{"type":"int32"},"payload":5',  # cut short
        b"[1, 2]",  # JSON, not an object
    ],
)
def test_split_envelope_rejects_what_is_not_an_envelope(record):
    with pytest.raises(ValueError):
        split_envelope(record)


def test_json_without_schemas_is_told_which_converter_setting_to_change():
    with pytest.raises(ValueError, match="value.converter.schemas.enable to true"):
        split_envelope(b'{"before": null, "after": {"id": 1}, "op": "c"}')
    with pytest.raises(ValueError) as err:
        split_envelope(b"\x00\x01garbage")
    assert "converter" not in str(err.value)


def test_schema_id_is_stable_and_distinguishes_schemas():
    assert schema_id(b'{"a":1}') == schema_id(b'{"a":1}')
    assert schema_id(b'{"a":1}') != schema_id(b'{"a":2}')


def test_slice_ranges_cuts_big_ranges_into_tasks():
    slices = slice_ranges([OffsetRange("t", 0, 10, 25), OffsetRange("u", 1, 0, 3)], size=10)
    assert slices == [
        OffsetRange("t", 0, 10, 20),
        OffsetRange("t", 0, 20, 25),
        OffsetRange("u", 1, 0, 3),
    ]


def test_schema_ids_are_stable_and_sent_once_per_task():
    from cdclake.raw_rows import SchemaIds

    ids = SchemaIds()
    a, b = b'{"type":"struct","v":1}', b'{"type":"struct","v":2}'
    seq = [("value", a), ("value", a), ("key", a), ("value", b), ("value", a), ("value", b)]
    got = [ids.id_of(side, s) for side, s in seq]
    assert [sid for sid, _ in got] == [schema_id(s) for _, s in seq]
    # the text goes with the first record of each schema only, whatever side it is on
    assert [first for _, first in got] == [True, False, False, True, False, False]


class _Message:
    def __init__(self, offset: int, eof: bool = False):
        self._offset, self._eof = offset, eof

    def error(self):
        if not self._eof:
            return None

        class _Eof:
            def code(self):
                return -191  # _PARTITION_EOF

        return _Eof()

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, 1_700_000_000_000 + self._offset)

    def headers(self):
        return None

    def key(self):
        return b'{"schema":{"type":"int32"},"payload":%d}' % self._offset

    def value(self):
        return b'{"schema":{"type":"int32"},"payload":%d}' % (self._offset * 10)


class _Partition:
    """What a consumer of one partition would return: records at `offsets`, then the
    end-of-partition event at `high`. Notes every count asked for."""

    def __init__(self, offsets: list[int], high: int):
        self.queue = [_Message(o) for o in offsets] + [_Message(high, eof=True)]
        self.asked: list[tuple[int, int]] = []  # (num_messages, what was left to give)

    def __call__(self, config):
        return self

    def assign(self, partitions):
        start = partitions[0].offset
        self.queue = [m for m in self.queue if m.offset() >= start]

    def consume(self, num_messages, timeout):
        self.asked.append((num_messages, len(self.queue)))
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def close(self):
        pass


@pytest.mark.parametrize(
    "offsets, start, end",
    [
        (list(range(10)), 0, 10),  # a small range: fewer records than one fetch
        (list(range(5000)), 1200, 4500),  # several fetches, the last one partial
        ([*range(8), 9], 0, 10),  # a gap (a transaction marker at offset 8)
    ],
)
def test_a_slice_never_asks_the_broker_for_more_records_than_it_needs(
    monkeypatch, offsets, start, end
):
    """librdkafka's consume() waits for its whole timeout while it has fewer messages
    than asked for: asking for more than the range holds would add that wait to the
    end of every slice (a second for each small table of a batch)."""
    import confluent_kafka
    from cdclake.kafka.reader import _read_slice

    partition = _Partition(offsets, high=offsets[-1] + 1)
    monkeypatch.setattr(confluent_kafka, "Consumer", partition)
    row = {"topic": "t", "partition": 0, "start": start, "end": end}
    batches = list(_read_slice({"bootstrap.servers": "unused"}, row, timeout_s=5))
    got = [o for b in batches for o in b.column("offset").to_pylist()]
    assert got == [o for o in offsets if start <= o < end]
    # a record after offsets that were not read, of another key than the one before it
    gaps = [o for b in batches for o, gap in zip(b.column("offset").to_pylist(),
                                                 b.column("follows_gap").to_pylist(),
                                                 strict=True) if gap]  # fmt: skip
    assert gaps == [o for i, o in enumerate(got) if o > (got[i - 1] if i else start - 1) + 1]
    # every call could be answered at once: it never asked for more than was there
    assert all(n <= left for n, left in partition.asked), partition.asked


def _envelope(schema: bytes, payload: bytes) -> bytes:
    return b'{"schema":' + schema + b',"payload":' + payload + b"}"


@pytest.mark.parametrize("how", ["lists", "arrow", "arrow in pieces"])
def test_raw_rows_equal_the_rows_of_record_row(how):
    """The prefix shortcut over runs of records with Arrow compute functions
    (`add_many`) must give exactly the general path's rows: schema switches and returns,
    tombstones, records without key, broken envelopes and bad UTF-8."""
    import pyarrow as pa
    from cdclake.raw_rows import RawRows, SchemaIds, raw_arrow_schema, record_row

    k, a, b = b'{"type":"int32"}', b'{"type":"struct","v":1}', b'{"type":"struct","v":2}'
    records = [
        (_envelope(k, b"1"), _envelope(a, b'{"op":"c"}')),
        (_envelope(k, b"2"), _envelope(a, b'{"op":"u"}')),  # same schemas: shortcut
        (_envelope(k, b"2"), None),  # tombstone
        (None, _envelope(a, b'{"op":"c"}')),  # no key
        (_envelope(k, b"3"), _envelope(b, b'{"op":"c"}')),  # schema change
        (_envelope(k, b"1"), _envelope(a, b'{"op":"u"}')),  # and back
        (_envelope(k, b"4"), b'{"payload":{}}'),  # not an envelope
        (_envelope(k, b"5"), _envelope(a, b'{"x":"\xff"}')),  # the last schema, bad UTF-8
        (_envelope(k, b"6"), _envelope(a, b'{"op":"c"}')[:-3]),  # the last schema, cut short
        (_envelope(k, b"7"), _envelope(a, b'{"op":"d"}')),
        (None, None),
        (_envelope(k, b"8"), _envelope(a, b'{"op":"u","note":",\\"payload\\":"}')),
        (_envelope(k, b"9"), _envelope(a, b'{"op":"u"}')),
        (_envelope(k, b"9"), None),
        (None, _envelope(a, b'{"op":"c"}')),
        (_envelope(k, b"10"), _envelope(a, b'{"op":"c","x":"\xc3\xa9"}')),
    ]
    rows = RawRows("t", 3)
    offsets = list(range(len(records)))
    stamps = [1000 + o for o in offsets]
    keys, values = [r[0] for r in records], [r[1] for r in records]
    if how == "lists":
        rows.add_many(offsets, stamps, keys, values)
    else:
        cuts = [0, len(records)] if how == "arrow" else [0, 1, 2, 5, 9, 10, 14, len(records)]
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            rows.add_many(pa.array(offsets[lo:hi], pa.int64()), pa.array(stamps[lo:hi]),
                          pa.chunked_array([pa.array(keys[lo:hi], pa.binary())]),
                          pa.array(values[lo:hi], pa.binary()))  # fmt: skip
    assert len(rows) == len(records)
    got = rows.batch()
    seen = SchemaIds()
    want = [record_row(seen, "t", 3, o, 1000 + o, key, value)
            for o, (key, value) in enumerate(records)]  # fmt: skip
    expected = pa.RecordBatch.from_pylist(want, schema=raw_arrow_schema())
    assert got.to_pylist() == expected.to_pylist()
    assert len(rows) == 0  # the batch took the rows
    # the errors are there (not both paths equally wrong)
    errors = [r["error"] for r in got.to_pylist()]
    assert sum(e is not None for e in errors) == 3, errors


def test_the_driver_read_gives_up_beyond_its_byte_budget(monkeypatch):
    """A small batch of wide records (big TOASTed values) must not fill the driver: past
    the budget the driver read stops and says so (the batch is read by Spark tasks)."""
    import confluent_kafka
    from cdclake.config import KafkaConfig
    from cdclake.kafka.reader import read_local

    kafka, ranges = KafkaConfig("unused"), [OffsetRange("t", 0, 0, 5000)]
    monkeypatch.setattr(confluent_kafka, "Consumer", _Partition(list(range(5000)), high=5000))
    rows = read_local(kafka, ranges, timeout_s=5)
    assert rows.column("offset").to_pylist() == list(range(5000))
    held = rows.nbytes

    partition = _Partition(list(range(5000)), high=5000)
    monkeypatch.setattr(confluent_kafka, "Consumer", partition)
    assert read_local(kafka, ranges, timeout_s=5, max_bytes=held // 4) is None
    # it stopped after the first fetch (2,000 records) instead of reading them all
    assert len(partition.asked) == 1 and len(partition.queue) == 3001
