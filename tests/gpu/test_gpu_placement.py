"""Source-to-GPU placement and replica sharding: the rules in vdet.gpu.placement's docstring."""

from __future__ import annotations

from collections import Counter

import pytest

from vdet.gpu.placement import PlacementError, SourceDemand, assign, load_by_gpu, shard_of


def demands(*ids: str, **pinned: int) -> list[SourceDemand]:
    return [SourceDemand(i) for i in ids] + [SourceDemand(i, gpu) for i, gpu in pinned.items()]


@pytest.mark.parametrize(
    ("sources", "gpu_count", "previous", "expected"),
    [
        pytest.param([], 2, {}, {}, id="empty"),
        pytest.param(demands("a"), 1, {}, {"a": 0}, id="one-gpu"),
        pytest.param(
            demands("a", "b", "c", "d", "e"),
            2,
            {},
            {"a": 0, "b": 1, "c": 0, "d": 1, "e": 0},
            id="least-loaded-ties-to-lowest-index",
        ),
        pytest.param(
            demands("e", "d", "c", "b", "a"),
            2,
            {},
            {"a": 0, "b": 1, "c": 0, "d": 1, "e": 0},
            id="input-order-does-not-matter",
        ),
        pytest.param(
            demands("a", "b", "c", x=0, y=0),
            2,
            {},
            {"x": 0, "y": 0, "a": 1, "b": 1, "c": 0},
            id="pinned-first-then-fill-the-emptier-gpu",
        ),
        pytest.param(
            demands("a", "b", "c"),
            2,
            {"a": 1, "b": 1},
            {"a": 1, "b": 1, "c": 0},
            id="sticky-even-when-unbalanced",
        ),
        pytest.param(
            demands("a", "b", "new"),
            3,
            {"a": 0, "b": 1},
            {"a": 0, "b": 1, "new": 2},
            id="added-gpu-takes-new-streams-and-moves-none",
        ),
        pytest.param(
            demands("a", "b"),
            2,
            {"a": 3, "gone": 0},
            {"a": 0, "b": 1},
            id="previous-gpu-gone-and-stale-entries-ignored",
        ),
        pytest.param(
            demands("a", a_pinned=1),
            2,
            {"a_pinned": 0},
            {"a_pinned": 1, "a": 0},
            id="pin-beats-sticky",
        ),
    ],
)
def test_assign(
    sources: list[SourceDemand],
    gpu_count: int,
    previous: dict[str, int],
    expected: dict[str, int],
) -> None:
    assert assign(sources, gpu_count, previous=previous) == expected


def test_assign_is_deterministic_and_idempotent() -> None:
    sources = demands(*(f"cam-{i:02d}" for i in range(22)), pinned=2)
    first = assign(sources, 4)
    assert assign(list(reversed(sources)), 4) == first
    assert assign(sources, 4, previous=first) == first
    assert load_by_gpu(first, 4) == [6, 6, 6, 5]


def test_removing_a_stream_moves_no_other() -> None:
    sources = demands(*(f"cam-{i}" for i in range(9)))
    before = assign(sources, 3)
    after = assign([s for s in sources if s.id != "cam-4"], 3, previous=before)
    assert after == {k: v for k, v in before.items() if k != "cam-4"}


def test_sticky_source_crowded_out_by_pinned_streams_is_placed_elsewhere() -> None:
    sources = demands("a", p1=0, p2=0)
    placed = assign(sources, 2, previous={"a": 0}, max_streams_per_gpu=2)
    assert placed == {"p1": 0, "p2": 0, "a": 1}


def test_capacity_fills_every_gpu_then_fails_naming_the_rest() -> None:
    assert load_by_gpu(assign(demands("a", "b", "c", "d"), 2, max_streams_per_gpu=2), 2) == [2, 2]
    with pytest.raises(PlacementError, match=r"1 source\(s\) do not fit \(e\)"):
        assign(demands("a", "b", "c", "d", "e"), 2, max_streams_per_gpu=2)


@pytest.mark.parametrize(
    ("sources", "gpu_count", "limit", "message"),
    [
        (demands("a", a=0), 2, None, "duplicate source id"),
        (demands(a=2), 2, None, r"pinned to gpu 2, but this node has 2 GPU\(s\)"),
        (demands(a=0, b=0), 2, 1, "already has 1 pinned stream"),
        (demands("a"), 0, None, "gpu_count must be at least 1"),
        (demands("a"), 1, 0, "max_streams_per_gpu must be at least 1"),
    ],
)
def test_assign_errors(
    sources: list[SourceDemand], gpu_count: int, limit: int | None, message: str
) -> None:
    with pytest.raises(PlacementError, match=message):
        assign(sources, gpu_count, max_streams_per_gpu=limit)


@pytest.mark.parametrize(("source_id", "gpu"), [("", None), ("a", -1)])
def test_source_demand_validates(source_id: str, gpu: int | None) -> None:
    with pytest.raises(ValueError, match="SourceDemand"):
        SourceDemand(source_id, gpu)


def test_load_by_gpu_rejects_an_index_out_of_range() -> None:
    assert load_by_gpu({}, 2) == [0, 0]
    with pytest.raises(PlacementError, match=r"outside 0\.\.1"):
        load_by_gpu({"a": 2}, 2)


def test_shard_of_is_stable_in_range_and_spread() -> None:
    ids = [f"cam-{i:03d}" for i in range(600)]
    shards = [shard_of(i, 3) for i in ids]
    assert shards == [shard_of(i, 3) for i in ids]
    assert all(shard_of(i, 1) == 0 for i in ids[:20])
    counts = Counter(shards)
    assert set(counts) == {0, 1, 2}
    assert all(150 <= n <= 250 for n in counts.values()), counts


def test_shard_of_known_values_do_not_drift() -> None:
    # Pinned so that a change of hash or tie-break, which would reshard a live fleet, is seen.
    assert [shard_of(f"cam-{i}", 4) for i in range(8)] == KNOWN_SHARDS_OF_4


def test_growing_the_fleet_moves_only_sources_onto_the_new_replica() -> None:
    ids = [f"cam-{i:03d}" for i in range(600)]
    moved = [(shard_of(i, 3), shard_of(i, 4)) for i in ids if shard_of(i, 3) != shard_of(i, 4)]
    assert all(new == 3 for _, new in moved)
    assert 100 <= len(moved) <= 200  # about a quarter


@pytest.mark.parametrize(("source_id", "count"), [("a", 0), ("", 2)])
def test_shard_of_errors(source_id: str, count: int) -> None:
    with pytest.raises(PlacementError):
        shard_of(source_id, count)


KNOWN_SHARDS_OF_4 = [0, 3, 1, 1, 0, 1, 3, 1]
