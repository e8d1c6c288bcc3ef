"""Which GPU of a node runs which source, and which replica of a fleet owns which source.

This module only decides; it starts nothing, touches no CUDA and keeps no state between calls,
so the same inputs always give the same answer (what makes it testable and safe to re-run on
every change). The caller owns the GPUs and passes in what it placed last time.

One node, several GPUs (`assign`): one device per GPU, each seeing only its own, runs the
streams assigned to it. The rules, applied in this order:

1. Pinned: a source that names a `gpu` runs on that GPU. An index the node doesn't have is an
   error, never a silent move: whoever pinned it had a reason (a NVDEC session limit, a model
   that only fits on the larger card).
2. Sticky: a source placed before (in `previous`) stays where it was while that GPU still
   exists and has room. Moving a live stream restarts its decoder and loses frames, so a new
   GPU or a removed stream never reshuffles the others.
3. Least loaded: every other source, in order of id, goes to the GPU with the fewest streams;
   a tie goes to the lowest GPU index.

`max_streams_per_gpu` bounds every GPU; pinned sources count towards it and a full node is an
error that names what did not fit.

Many replicas (`shard_of`): each source belongs to exactly one replica, chosen by rendezvous
(highest random weight) hashing of its id. It needs no coordination, is the same in every
process and on every machine, and when the replica count changes from N to N+1 only about
1/(N+1) of the sources move, all of them to the new replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PlacementError", "SourceDemand", "assign", "load_by_gpu", "shard_of"]


class PlacementError(ValueError):
    """The sources cannot be placed as asked; the message says which and why."""


@dataclass(frozen=True)
class SourceDemand:
    """A source to place: its stream id and, optionally, the GPU index it must run on."""

    id: str
    gpu: int | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("SourceDemand.id must not be empty")
        if self.gpu is not None and self.gpu < 0:
            raise ValueError(f"SourceDemand.gpu must be >= 0 or None, got {self.gpu}")


def assign(
    sources: Iterable[SourceDemand],
    gpu_count: int,
    *,
    previous: Mapping[str, int] | None = None,
    max_streams_per_gpu: int | None = None,
) -> dict[str, int]:
    """Map every source id to a GPU index in ``range(gpu_count)`` (see the module docstring).

    `previous` is the assignment returned last time (entries for sources that are gone, or for
    GPUs that are gone, are ignored). Raises PlacementError for duplicate ids, a pinned GPU the
    node doesn't have, or more streams than the GPUs may take.
    """
    if gpu_count < 1:
        raise PlacementError(f"gpu_count must be at least 1, got {gpu_count}")
    if max_streams_per_gpu is not None and max_streams_per_gpu < 1:
        raise PlacementError(f"max_streams_per_gpu must be at least 1, got {max_streams_per_gpu}")
    demands = sorted(sources, key=lambda s: s.id)
    _check_unique(demands)
    previous = previous or {}
    capacity = max_streams_per_gpu
    load = [0] * gpu_count
    placed: dict[str, int] = {}

    for demand in demands:
        if demand.gpu is None:
            continue
        if demand.gpu >= gpu_count:
            raise PlacementError(
                f"source {demand.id!r} is pinned to gpu {demand.gpu}, but this node has "
                f"{gpu_count} GPU(s) (0..{gpu_count - 1})"
            )
        if capacity is not None and load[demand.gpu] >= capacity:
            raise PlacementError(
                f"source {demand.id!r} is pinned to gpu {demand.gpu}, which already has "
                f"{capacity} pinned stream(s), its limit (max_streams_per_gpu)"
            )
        placed[demand.id] = demand.gpu
        load[demand.gpu] += 1

    unpinned = [d for d in demands if d.gpu is None]
    for demand in unpinned:
        gpu = previous.get(demand.id)
        if gpu is None or not 0 <= gpu < gpu_count:
            continue
        if capacity is not None and load[gpu] >= capacity:
            continue  # crowded out by pinned streams: placed with the rest below
        placed[demand.id] = gpu
        load[gpu] += 1

    unplaced: list[str] = []
    for demand in unpinned:
        if demand.id in placed:
            continue
        gpu = min(range(gpu_count), key=lambda g: (load[g], g))
        if capacity is not None and load[gpu] >= capacity:
            unplaced.append(demand.id)
            continue
        placed[demand.id] = gpu
        load[gpu] += 1
    if unplaced:
        raise PlacementError(
            f"{len(unplaced)} source(s) do not fit ({', '.join(unplaced)}): "
            f"{gpu_count} GPU(s) x {capacity} stream(s) each (max_streams_per_gpu)"
        )
    return placed


def load_by_gpu(assignment: Mapping[str, int], gpu_count: int) -> list[int]:
    """How many streams each GPU runs under `assignment`, indexed by GPU."""
    load = [0] * gpu_count
    for source_id, gpu in assignment.items():
        if not 0 <= gpu < gpu_count:
            raise PlacementError(
                f"source {source_id!r} is on gpu {gpu}, outside 0..{gpu_count - 1}"
            )
        load[gpu] += 1
    return load


def shard_of(source_id: str, shard_count: int) -> int:
    """The replica (0..shard_count-1) that owns `source_id`, by rendezvous hashing.

    The weight of (replica, source) is the first 8 bytes of BLAKE2b over both, so the answer
    is the same in every process, unlike Python's salted `hash()`.
    """
    if shard_count < 1:
        raise PlacementError(f"shard_count must be at least 1, got {shard_count}")
    if not source_id:
        raise PlacementError("source_id must not be empty")
    return max(range(shard_count), key=lambda shard: (_weight(shard, source_id), -shard))


def _weight(shard: int, source_id: str) -> int:
    digest = hashlib.blake2b(f"{shard}\x00{source_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _check_unique(demands: Sequence[SourceDemand]) -> None:
    seen: set[str] = set()
    duplicates: set[str] = set()
    for demand in demands:
        (duplicates if demand.id in seen else seen).add(demand.id)
    if duplicates:
        raise PlacementError(f"duplicate source id(s): {', '.join(sorted(duplicates))}")
