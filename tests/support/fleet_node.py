"""One fleet node in its own process, for the fleet's tests: a real `FleetNode` on real NATS
servers, whose streams are recorded instead of run.

Stand-in, named: `RecordingStreams` takes the place of the node's local streams (the
`StreamControl` a `vdet serve` node would pass); it writes what it is asked to run to the
node's log, one JSON line per event, with the wall time: `add`/`remove` from the stand-in and
claimed/started/lost/fenced/released/failed from the node. Running real streams is the stream
service's business and is tested there; here the question is where each stream runs, when.

    python -m support.fleet_node --servers nats://... --node a --capacity 2 --log a.jsonl
SIGTERM hands the node's streams off and exits; SIGKILL is a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from vdet.config.streams import StreamSpec
from vdet.fleet.node import FleetNode
from vdet.fleet.store import FleetOptions, FleetStore
from vdet.streams.service import DuplicateStreamError, StreamChanges, UnknownStreamError


class RecordingStreams:
    """A `StreamControl` that records (module docstring)."""

    def __init__(self, log: Path) -> None:
        self._log = log
        self._lock = threading.Lock()
        self.running: set[str] = set()

    def write(self, **record: Any) -> None:
        with self._lock, self._log.open("a") as f:
            f.write(json.dumps({"t": time.time(), **record}) + "\n")

    def add(self, spec: StreamSpec) -> None:
        if spec.id in self.running:
            raise DuplicateStreamError(spec.id)
        self.running.add(spec.id)
        self.write(event="add", stream=spec.id, url=spec.url)

    def change(self, stream_id: str, changes: StreamChanges) -> None:
        raise NotImplementedError

    def remove(self, stream_id: str) -> None:
        if stream_id not in self.running:
            raise UnknownStreamError(stream_id)
        self.running.discard(stream_id)
        self.write(event="remove", stream=stream_id)


async def main(args: argparse.Namespace) -> None:
    options = FleetOptions(
        servers=tuple(args.servers.split(",")),
        node_id=args.node,
        capacity=args.capacity,
        lease_s=args.lease,
        node_ttl_s=args.lease,
        replicas=args.replicas,
        tick_s=0.1,
    )
    streams = RecordingStreams(Path(args.log))
    store = await FleetStore.open(options)
    node = FleetNode(
        options,
        store,
        streams,  # type: ignore[arg-type]
        on_event=lambda kind, sid, detail: streams.write(event=kind, stream=sid, detail=detail),
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(node.stop()))
    streams.write(event="joined", stream="")
    await node.run()
    streams.write(event="left", stream="")
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--log", required=True)
    asyncio.run(main(parser.parse_args()))
