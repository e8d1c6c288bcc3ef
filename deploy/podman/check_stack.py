"""Check a running compose stack from outside, as a user would: vdet serves live detections of
the demo camera, and Prometheus scrapes vdet.

    python3 deploy/podman/check_stack.py [--vdet URL] [--prometheus URL] [--timeout S]

Each check is polled until it holds or the shared deadline passes; the first one that never
holds ends the run with exit status 1 and what was last seen. Only the standard library, so it
runs with any Python 3.11 (deploy/podman/ci-stack.sh runs it against the Podman stack).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

STREAM = "demo"  # deploy/vdet.yaml's source, the compose camera
# A counting line added over the API by the first run, which the stack's `streams_file` (on
# its `state` volume) must bring back after vdet's container restarts.
KEPT_ZONE = "kept-across-restarts"


class CheckFailedError(Exception):
    pass


def get_json(url: str) -> Any:
    """The JSON body at `url`, or None for 204 No Content (vdet: no frame published yet)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        if response.status == 204:
            return None
        return json.load(response)


def poll(what: str, probe: Callable[[], tuple[bool, str]], deadline: float) -> str:
    """Call `probe` until it says ok; its text is what the check saw (shown either way)."""
    seen = "nothing yet"
    while True:
        try:
            ok, seen = probe()
        except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
            ok, seen = False, f"{type(error).__name__}: {error}"
        if ok:
            print(f"check_stack: ok   {what}: {seen}", flush=True)
            return seen
        if time.monotonic() > deadline:
            raise CheckFailedError(f"{what}: never held; last seen: {seen}")
        time.sleep(1)


def ready(vdet: str) -> tuple[bool, str]:
    body = get_json(f"{vdet}/readyz")
    return bool(body["ready"]), f"ready={body['ready']} backend={body.get('backend')}"


def detections(vdet: str, previous: list[int]) -> tuple[bool, str]:
    """Frames with detections, and a later frame than the last poll's: the stream is live."""
    frame = get_json(f"{vdet}/v1/streams/{STREAM}/detections")
    if frame is None:
        return False, "no frame published yet (204 No Content)"
    seq, count = int(frame["seq"]), len(frame["detections"])
    advanced = bool(previous) and seq > previous[-1]
    previous.append(seq)
    return advanced and count > 0, f"seq {seq}, frame {frame['frame_index']}, {count} detections"


def put_zone(vdet: str) -> tuple[bool, str]:
    body = json.dumps({"kind": "line", "points": [[0.25, 0], [0.25, 1]]}).encode()
    request = urllib.request.Request(
        f"{vdet}/v1/streams/{STREAM}/zones/{KEPT_ZONE}",
        data=body,
        method="PUT",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status in (200, 201), f"PUT {KEPT_ZONE}: {response.status}"


def zone_kept(vdet: str) -> tuple[bool, str]:
    ids = [zone["id"] for zone in get_json(f"{vdet}/v1/streams/{STREAM}/zones")["zones"]]
    return KEPT_ZONE in ids, f"zones of {STREAM}: {ids}"


def prometheus_value(prometheus: str, promql: str) -> float | None:
    query = urllib.parse.urlencode({"query": promql})
    answer = get_json(f"{prometheus}/api/v1/query?{query}")
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def scraped(prometheus: str, promql: str, wanted: Callable[[float], bool]) -> tuple[bool, str]:
    value = prometheus_value(prometheus, promql)
    return value is not None and wanted(value), f"{promql} = {value}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdet", default="http://127.0.0.1:8000", help="vdet's base URL")
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus' URL")
    parser.add_argument("--timeout", type=float, default=120, help="seconds for all checks")
    parser.add_argument(
        "--after-restart",
        action="store_true",
        help="vdet was restarted: check that the zone the first run added came back, and "
        "that detections flow again (Prometheus is not checked again)",
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    seqs: list[int] = []
    try:
        poll("vdet ready", lambda: ready(args.vdet), deadline)
        if args.after_restart:
            poll("the zone added over the API is back", lambda: zone_kept(args.vdet), deadline)
            poll(f"live detections from {STREAM}", lambda: detections(args.vdet, seqs), deadline)
            return 0
        poll(f"live detections from {STREAM}", lambda: detections(args.vdet, seqs), deadline)
        poll("a zone added over the API", lambda: put_zone(args.vdet), deadline)
        poll(
            "Prometheus scrapes vdet",
            lambda: scraped(args.prometheus, 'up{job="vdet"}', lambda v: v == 1),
            deadline,
        )
        frames = f'vdet_frames_processed_total{{source="{STREAM}"}}'
        poll(
            "a vdet series in Prometheus",
            lambda: scraped(args.prometheus, frames, lambda v: v > 0),
            deadline,
        )
    except CheckFailedError as failure:
        print(f"check_stack: FAIL {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
