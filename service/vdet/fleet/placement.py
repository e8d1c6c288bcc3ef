"""Which streams a node claims: the fleet's placement rule, as a pure function of one view.

Every node runs the same rule on its own mirror of the fleet (desired streams, owners, live
nodes): the unowned streams, in id order, each to the least loaded live node that has room
(ties: the lower node id), counting what each node owns and what the plan gave it so far. A
node claims what the plan gives it; the owner leases' compare-and-set (vdet.fleet.store)
settles two nodes whose views differ for a moment. Nothing owned is ever moved: a node that
comes back does not take streams from the nodes that run them, and a stream whose owner died
stays owned until its lease expires (the owner may be alive behind a cut network, still
running it until it fails to renew). Draining nodes (shutting down) get nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeState:
    """What a node says of itself in the node registry."""

    node_id: str
    capacity: int  # streams it can run (its worker plan and GPUs)
    draining: bool = False


def plan(
    desired: Iterable[str], owners: Mapping[str, str], nodes: Mapping[str, NodeState]
) -> dict[str, str]:
    """Stream id -> node id for every unowned desired stream the live nodes have room for."""
    load = {node_id: 0 for node_id, node in nodes.items() if not node.draining}
    for owner in owners.values():
        if owner in load:
            load[owner] += 1
    placed: dict[str, str] = {}
    for stream_id in sorted(set(desired) - set(owners)):
        room = [n for n in load if load[n] < nodes[n].capacity]
        if not room:
            break
        chosen = min(room, key=lambda n: (load[n], n))
        placed[stream_id] = chosen
        load[chosen] += 1
    return placed


def to_claim(
    me: str,
    desired: Iterable[str],
    owners: Mapping[str, str],
    nodes: Mapping[str, NodeState],
) -> list[str]:
    """The unowned streams `me` should claim now, in id order."""
    return [s for s, node in sorted(plan(desired, owners, nodes).items()) if node == me]


__all__ = ["NodeState", "plan", "to_claim"]
