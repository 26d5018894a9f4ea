"""Wire format and batch layout: pure functions, no processes."""

from __future__ import annotations

import pickle

import pytest
import torch

from collocate.share.errors import LayoutError, ProtocolError
from collocate.share.layout import Layout, layout_for
from collocate.share.protocol import (
    MAX_RELEASE,
    Batch,
    Msg,
    decode,
    encode,
    encode_release,
)


def test_struct_messages_round_trip() -> None:
    kind, body = decode(encode(Msg.BATCH, 3, 2**40, 7, 96, 8))
    assert kind is Msg.BATCH and body == Batch(3, 2**40, 7, 96, 8)
    assert decode(encode(Msg.RELEASE, 11)) == (Msg.RELEASE, (11,))
    assert decode(encode(Msg.ATTACH, -1)) == (Msg.ATTACH, (-1,))
    assert decode(encode(Msg.HEARTBEAT)) == (Msg.HEARTBEAT, None)


def test_release_carries_one_or_many_sequence_numbers() -> None:
    assert decode(encode_release([3, 4, 2**63])) == (Msg.RELEASE, (3, 4, 2**63))
    assert decode(encode_release(list(range(MAX_RELEASE))))[1] == tuple(range(MAX_RELEASE))
    with pytest.raises(ValueError):
        encode_release([])
    for body in (b"", b"\x00" * 12, b"\x00" * 8 * (MAX_RELEASE + 1)):
        with pytest.raises(ProtocolError, match="RELEASE body"):
            decode(bytes([Msg.RELEASE]) + body)


def test_json_messages_round_trip_and_require_keys() -> None:
    kind, body = decode(encode(Msg.DETACH, payload={"reason": "slow", "code": "stalled"}))
    assert kind is Msg.DETACH and body["reason"] == "slow"
    with pytest.raises(ProtocolError, match="lacks code"):
        decode(encode(Msg.DETACH, payload={"reason": "slow"}))


@pytest.mark.parametrize("data, match", [
    (b"", "empty"),
    (bytes([200]), "unknown message type"),
    (bytes([Msg.BATCH]) + b"\x00" * 5, "expected"),
    (bytes([Msg.BATCH]) + b"\x00" * 33, "expected"),
    (bytes([Msg.HEARTBEAT]) + b"x", "empty body"),
    (bytes([Msg.HELLO]) + b"{not json", "not valid JSON"),
    (bytes([Msg.HELLO]) + b"[1, 2]", "JSON object"),
])
def test_malformed_messages_are_rejected(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(data)


def test_pickle_payloads_are_never_unpickled() -> None:
    class Boom:
        def __reduce__(self):  # would run at unpickling time
            return (pytest.fail, ("unpickled a peer's message",))

    with pytest.raises(ProtocolError):
        decode(bytes([Msg.HELLO]) + pickle.dumps(Boom()))


def test_layout_of_dict_tuple_and_tensor_batches() -> None:
    d = layout_for({"img": torch.zeros(4, 3, 2, 2, dtype=torch.uint8), "y": torch.zeros(4, dtype=torch.int64)})
    assert d.kind == "dict" and d.capacity == 4 and [f.key for f in d.fields] == ["img", "y"]
    assert d.fields[0].sample_bytes == 12 and d.fields[1].offset % 64 == 0 and d.slot_bytes % 4096 == 0
    assert Layout.from_json(d.to_json()) == d
    t = layout_for((torch.zeros(5, 2), torch.zeros(5)))
    assert t.kind == "tuple" and isinstance(t.unflatten([torch.ones(1, 2), torch.ones(1)]), tuple)
    assert layout_for(torch.zeros(3, 2)).unflatten([torch.ones(3, 2)]).shape == (3, 2)


def test_layout_validates_later_batches() -> None:
    layout = layout_for({"x": torch.zeros(8, 3), "y": torch.zeros(8, dtype=torch.int64)})
    tensors, count = layout.flatten({"x": torch.zeros(5, 3), "y": torch.zeros(5, dtype=torch.int64)}, 1)
    assert count == 5 and len(tensors) == 2
    with pytest.raises(LayoutError, match="slots hold 8"):
        layout.flatten({"x": torch.zeros(9, 3), "y": torch.zeros(9, dtype=torch.int64)}, 2)
    with pytest.raises(LayoutError, match="float32\\[3\\]"):
        layout.flatten({"x": torch.zeros(8, 4), "y": torch.zeros(8, dtype=torch.int64)}, 3)
    with pytest.raises(LayoutError, match="keys"):
        layout.flatten({"x": torch.zeros(8, 3)}, 4)
    with pytest.raises(LayoutError, match="disagree"):
        layout.flatten({"x": torch.zeros(8, 3), "y": torch.zeros(7, dtype=torch.int64)}, 5)


@pytest.mark.parametrize("batch, match", [
    ({"x": torch.zeros(2), "names": ["a", "b"]}, "not a tensor"),
    ("text", "cannot share"),
    (torch.tensor(1.0), "0-d"),
])
def test_unshareable_batches_get_a_clear_error(batch: object, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        layout_for(batch)


def test_malformed_layout_from_a_peer_is_rejected() -> None:
    good = layout_for(torch.zeros(4, 2)).to_json()
    bad = {**good, "fields": [{**good["fields"][0], "sample_bytes": 10**9}]}
    with pytest.raises(ProtocolError, match="does not fit"):
        Layout.from_json(bad)
