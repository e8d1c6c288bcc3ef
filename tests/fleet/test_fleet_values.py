"""What nodes read from the buckets is input: values that do not parse are refused."""

from __future__ import annotations

import pytest

from vdet.fleet.placement import NodeState
from vdet.fleet.store import node_state_of, owner_of


def test_a_node_state_round_trips() -> None:
    assert node_state_of(b'{"node_id": "a", "capacity": 3, "draining": true}') == NodeState(
        "a", 3, True
    )


@pytest.mark.parametrize(
    "value",
    [b"", b"null", b"[]", b"{}", b'{"node_id": "a"}', b'{"node_id": "a", "capacity": -1}',
     b'{"node_id": "a", "capacity": "many"}', b"\xff\xfe", b'{"capacity": 2}'],
)  # fmt: skip
def test_node_states_that_do_not_parse_are_none(value: bytes) -> None:
    assert node_state_of(value) is None


@pytest.mark.parametrize("value", [b"", b"[]", b'{"node": 3}', b"{", b"\xff"])
def test_owner_values_that_do_not_parse_are_none(value: bytes) -> None:
    assert owner_of(value) is None
    assert owner_of(b'{"node": "b", "at": 1.0}') == "b"
