"""What a fleet node puts on the results bus and what it accepts back (vdet.fleet.feed), and
the in-place changes a node applies to a stream it runs (vdet.fleet.node)."""

from __future__ import annotations

import json

from vdet.fleet.feed import parse_payload, payload_of
from vdet.fleet.keys import key_problem
from vdet.fleet.node import _changes_between


def test_a_payload_round_trips_and_anything_else_is_refused() -> None:
    tail = ',"source_id":"cam1","frame_index":3}}'
    assert parse_payload(payload_of(3, tail)) == (3, tail)
    for bad in (
        b"",
        b"3",
        b"x " + tail.encode(),
        b"-1 " + tail.encode(),
        b"3 {}",
        b'3 ,"a":1}',  # not the end of a result event
        b'3 ,"a":1}}\n{"type":"shutdown"}}',
        b"\xff\xfe 3",
        b"1" * 19 + b" " + tail.encode(),
        b"3 " + b"," + b"x" * (5 << 20) + b"}}",
    ):
        assert parse_payload(bad) is None, bad[:40]


def test_fleet_stream_ids_are_subject_tokens() -> None:
    assert key_problem("cam-1_a.b") is None
    for bad in (".x", "x.", "a..b", "", "a b", "a*", "a>"):
        assert key_problem(bad) is not None, bad


def _spec(**fields: object) -> bytes:
    base = {"url": "rtsp://10.0.0.7/s", "conf_threshold": None, "zones": [], "loop": False}
    return json.dumps({**base, **fields}).encode()


def test_a_node_changes_a_running_stream_in_place_only_for_what_may_change() -> None:
    changes = _changes_between(_spec(), _spec(conf_threshold=0.6))
    assert changes is not None and changes.model_dump(exclude_unset=True) == {"conf_threshold": 0.6}
    back = _changes_between(_spec(conf_threshold=0.6), _spec())
    assert back is not None and back.model_dump(exclude_unset=True) == {"conf_threshold": None}
    assert _changes_between(_spec(), _spec(url="rtsp://10.0.0.8/s")) is None
    assert _changes_between(_spec(), _spec(loop=True)) is None
    assert _changes_between(b"not json", _spec()) is None
    assert _changes_between(_spec(), _spec(conf_threshold="high")) is None
