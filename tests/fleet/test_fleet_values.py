"""What nodes read from the buckets is input: values that do not parse are refused."""

from __future__ import annotations

import pytest

from vdet.fleet.placement import NodeState
from vdet.fleet.store import FleetStore, node_state_of, owner_of
from vdet.fleet.view import FleetView


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


def test_a_lease_not_seen_renewed_for_a_period_counts_as_expired() -> None:
    """A bucket that changed leader while keys expired may drop them without the purge marker
    the watchers see: the view ages leases out itself (the servers' compare-and-set still
    decides who gets the stream)."""
    view = FleetView(FleetStore.__new__(FleetStore))
    view.owners = {"cam0": ("a", 3), "cam1": ("b", 4)}
    view.owner_seen = {"cam0": 100.0, "cam1": 95.0}
    assert view.live_owners(6.0, now=101.0) == {"cam0": "a", "cam1": "b"}
    assert view.live_owners(6.0, now=101.5) == {"cam0": "a"}
    assert view.live_owners(6.0, now=107.0) == {}


def test_a_node_not_seen_heartbeating_for_its_ttl_counts_as_gone() -> None:
    """The same for the node registry: a paused or dead node whose entry's expiry did not
    reach this view is planned nothing (else its streams would wait for it)."""
    view = FleetView(FleetStore.__new__(FleetStore))
    view.nodes = {"a": NodeState("a", 2), "b": NodeState("b", 2)}
    view.node_seen = {"a": 100.0, "b": 95.0}
    assert sorted(view.live_nodes(6.0, now=101.0)) == ["a", "b"]
    assert sorted(view.live_nodes(6.0, now=101.5)) == ["a"]
    assert view.live_nodes(6.0, now=107.0) == {}
