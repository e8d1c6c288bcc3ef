"""GET /v1/nodes: the fleet's nodes and where its streams run (settings `cluster`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, Field

from vdet.api.deps import ServiceDep, not_ready
from vdet.api.schemas import ErrorOut

router = APIRouter(prefix="/v1/nodes", tags=["ops"])


class NodeOut(BaseModel):
    id: str = Field(description="The node's id (`cluster.node_id`, else its host name).")
    capacity: int = Field(description="Streams it takes from the fleet at most.")
    draining: bool = Field(description="Shutting down: handing its streams off, taking none.")
    streams: list[str] = Field(description="Ids of the streams whose lease it holds, sorted.")


class NodesOut(BaseModel):
    node: str = Field(description="The node that answered.")
    synced: bool = Field(
        description="Whether that node's view of the fleet is whole; false for a moment after "
        "it reconnected to NATS (the lists may then be short)."
    )
    nodes: list[NodeOut] = Field(description="Live nodes (and any that still hold a lease).")
    unowned: list[str] = Field(
        description="Desired streams no node runs now: waiting for room, or for a dead "
        "node's lease to expire."
    )


@router.get(
    "",
    response_model=NodesOut,
    summary="The fleet's nodes and the streams each runs",
    responses={404: {"model": ErrorOut, "description": "This server is one node, not in a fleet."}},
)
async def list_nodes(service: ServiceDep) -> NodesOut:
    # Async: the fleet's view lives on the event loop, read here without a thread.
    if not service.settings.cluster.enabled:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail="this server is not in a fleet (cluster.servers is empty)",
        )
    fleet = service.fleet
    if fleet is None or not service.ready:
        raise not_ready()
    info = fleet.info()
    return NodesOut(
        node=info.node_id,
        synced=info.synced,
        nodes=[
            NodeOut(id=n.node_id, capacity=n.capacity, draining=n.draining, streams=list(n.streams))
            for n in info.nodes
        ],
        unowned=list(info.unowned),
    )
