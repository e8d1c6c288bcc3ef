"""A node's view of the fleet (vdet.fleet.view) watching again after a reconnect, on a real
NATS server: reads keep what the view had until the new watchers have everything, and a
stream removed while the view was not watching is told as removed."""

from __future__ import annotations

import asyncio

from support.nats_servers import NatsServer

from vdet.fleet.store import FleetOptions, FleetStore
from vdet.fleet.view import FleetView


def test_watching_again_keeps_the_view_until_the_new_one_is_whole(server: NatsServer) -> None:
    async def run() -> None:
        options = FleetOptions((server.url,), "a", capacity=2, lease_s=2.0)
        store = await FleetStore.open(options)
        view = FleetView(store)
        removed: list[str] = []
        view.on_removed = removed.append
        try:
            for cam in ("cam0", "cam1"):
                await store.put_spec(cam, {"id": cam, "url": f"rtsp://127.0.0.1:8554/{cam}"})
            await view.start()
            assert sorted(view.desired) == ["cam0", "cam1"] and view.synced
            # The watchers lose their consumers (a server gone, say): changes meanwhile are
            # not seen until the view watches again.
            for watcher in view._watchers:
                await watcher.stop()
            await store.delete_spec("cam1")
            await store.put_spec("cam2", {"id": "cam2", "url": "rtsp://127.0.0.1:8554/cam2"})
            await store.claim("cam0", "b")
            restarting = asyncio.create_task(view.restart(10.0))
            await asyncio.sleep(0)  # the restart has begun, nothing is watched yet
            assert not view.synced
            assert sorted(view.desired) == ["cam0", "cam1"], "reads keep the view they had"
            await restarting
            assert view.synced and sorted(view.desired) == ["cam0", "cam2"]
            assert view.owner("cam0") == "b"
            assert removed == ["cam1"], "a stream removed meanwhile is told"
            # The new watchers follow changes, removals included.
            await store.delete_spec("cam2")
            for _ in range(100):
                if "cam2" not in view.desired:
                    break
                await asyncio.sleep(0.02)
            assert sorted(view.desired) == ["cam0"] and removed == ["cam1", "cam2"]
        finally:
            await view.stop()
            await store.close()

    asyncio.run(run())
