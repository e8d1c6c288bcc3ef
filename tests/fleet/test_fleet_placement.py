"""The fleet's placement rule (vdet.fleet.placement), a pure function of one view."""

from __future__ import annotations

from collections import Counter

from vdet.fleet.placement import NodeState, plan, to_claim


def nodes(*specs: tuple[str, int]) -> dict[str, NodeState]:
    return {n: NodeState(n, capacity) for n, capacity in specs}


def test_unowned_streams_go_to_the_least_loaded_node_with_room() -> None:
    fleet = nodes(("a", 2), ("b", 2), ("c", 2))
    placed = plan([f"s{i}" for i in range(5)], {}, fleet)
    assert sorted(placed) == [f"s{i}" for i in range(5)]
    assert max(Counter(placed.values()).values()) == 2
    assert sorted(Counter(placed.values()).values()) == [1, 2, 2]


def test_capacity_bounds_what_is_placed() -> None:
    fleet = nodes(("a", 1), ("b", 2))
    placed = plan([f"s{i}" for i in range(5)], {}, fleet)
    assert len(placed) == 3 and Counter(placed.values()) == {"a": 1, "b": 2}


def test_owned_streams_count_and_never_move() -> None:
    fleet = nodes(("a", 4), ("b", 4))
    owners = {"s0": "a", "s1": "a", "s2": "a"}
    placed = plan(["s0", "s1", "s2", "s3", "s4"], owners, fleet)
    # b is empty: the two new streams both go there; s0-s2 stay on a.
    assert placed == {"s3": "b", "s4": "b"}


def test_a_returning_node_takes_only_new_streams() -> None:
    fleet = nodes(("a", 4), ("b", 4))
    owners = {f"s{i}": "b" for i in range(4)}  # b took a's streams while a was away
    assert plan([f"s{i}" for i in range(4)], owners, fleet) == {}
    assert plan([f"s{i}" for i in range(5)], owners, fleet) == {"s4": "a"}


def test_the_dead_owners_streams_wait_for_their_leases() -> None:
    """An owner missing from the registry may be alive behind a cut link: its streams are not
    placed until their leases expire (the owners bucket drops them)."""
    fleet = nodes(("b", 4))
    assert plan(["s0", "s1"], {"s0": "a"}, fleet) == {"s1": "b"}


def test_draining_nodes_get_nothing_and_every_node_agrees() -> None:
    fleet = nodes(("a", 4), ("b", 4)) | {"c": NodeState("c", 4, draining=True)}
    desired = [f"s{i}" for i in range(6)]
    claims = {n: to_claim(n, desired, {}, fleet) for n in fleet}
    assert claims["c"] == []
    assert sorted(claims["a"] + claims["b"]) == desired
    assert not set(claims["a"]) & set(claims["b"])
