import pytest
from cdclake.offsets import OffsetRange
from cdclake.reader import schema_id, slice_ranges, split_envelope


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
    ],
)
def test_split_envelope(record, schema, payload):
    assert split_envelope(record) == (schema, payload)


@pytest.mark.parametrize(
    "record",
    [
        b'{"id": 1}',  # schemas disabled in the converter
        b"\x00\x01garbage",  # not JSON at all
        b'{"schema":{"type":"int32"}}',  # no payload
    ],
)
def test_split_envelope_rejects_what_is_not_an_envelope(record):
    with pytest.raises(ValueError):
        split_envelope(record)


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
    from cdclake.reader import SchemaIds

    ids = SchemaIds()
    a, b = b'{"type":"struct","v":1}', b'{"type":"struct","v":2}'
    seq = [("value", a), ("value", a), ("key", a), ("value", b), ("value", a), ("value", b)]
    got = [ids.id_of(side, s) for side, s in seq]
    assert [sid for sid, _ in got] == [schema_id(s) for _, s in seq]
    # the text goes with the first record of each schema only, whatever side it is on
    assert [first for _, first in got] == [True, False, False, True, False, False]
