"""Check a running fleet compose stack (docker-compose.fleet.yml) from outside, as a user would:
both nodes ready and seeing each other, the demo camera placed on one of them and its live
detections read through either, Prometheus scraping both; after the node running the camera
is killed, the camera's detections go on through the survivor.

    python3 deploy/podman/check_fleet.py --vdet URL --vdet URL [--prometheus URL] [--timeout S]
        # prints `owner=<node id>` last: the node that runs the demo camera
    python3 deploy/podman/check_fleet.py --vdet SURVIVOR_URL --after-kill NODE [--timeout S]

The checks are polled as in check_stack.py (its helpers; only the standard library), each
until it holds or the shared deadline passes.
"""

from __future__ import annotations

import argparse
import sys
import time

from check_stack import STREAM, CheckFailedError, detections, get_json, poll, ready, scraped


def nodes(vdet: str) -> dict[str, list[str]]:
    """node id -> the streams it runs, as `vdet` sees the fleet."""
    body = get_json(f"{vdet}/v1/nodes")
    return {node["id"]: list(node["streams"]) for node in body["nodes"]}


def placed(vdet: str, count: int) -> tuple[bool, str]:
    """`count` live nodes, the demo stream run by one of them, nothing unowned."""
    body = get_json(f"{vdet}/v1/nodes")
    seen = {node["id"]: node["streams"] for node in body["nodes"]}
    owners = [n for n, streams in seen.items() if STREAM in streams]
    ok = len(seen) == count and len(owners) == 1 and body["unowned"] == []
    return ok, f"nodes {seen}, unowned {body['unowned']}"


def read_through(vdet: str, owner: str) -> tuple[bool, str]:
    """The demo stream as `vdet` shows it: run by `owner`, streaming."""
    stream = get_json(f"{vdet}/v1/streams/{STREAM}")
    state = stream["status"]["state"]
    return stream["node"] == owner and state == "streaming", f"node {stream['node']}, {state}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdet", action="append", required=True, help="a node's base URL")
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus' URL")
    parser.add_argument("--timeout", type=float, default=180, help="seconds for all checks")
    parser.add_argument(
        "--after-kill",
        metavar="NODE",
        help="NODE (which ran the demo camera) was killed: check that the one --vdet left "
        "runs the camera and its detections flow",
    )
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    try:
        for vdet in args.vdet:
            poll(f"{vdet} ready", lambda vdet=vdet: ready(vdet), deadline)
        if args.after_kill:
            (survivor,) = args.vdet
            started = time.monotonic()
            poll(
                f"{STREAM} moved off {args.after_kill}",
                lambda: placed(survivor, 1),
                deadline,
            )
            seqs: list[int] = []
            poll(f"live detections of {STREAM}", lambda: detections(survivor, seqs), deadline)
            print(f"check_fleet: {STREAM} live again {time.monotonic() - started:.1f} s after")
            return 0
        count = len(args.vdet)
        for vdet in args.vdet:
            poll(f"{vdet} sees {count} nodes", lambda vdet=vdet: placed(vdet, count), deadline)
        owner = next(n for n, s in nodes(args.vdet[0]).items() if STREAM in s)
        for vdet in args.vdet:
            seqs = []
            poll(
                f"{STREAM} on {owner} read through {vdet}",
                lambda vdet=vdet: read_through(vdet, owner),
                deadline,
            )
            poll(
                f"live detections of {STREAM} through {vdet}",
                lambda vdet=vdet, seqs=seqs: detections(vdet, seqs),
                deadline,
            )
        poll(
            f"Prometheus scrapes {count} nodes",
            lambda: scraped(args.prometheus, 'sum(up{job="vdet"})', lambda v: v == count),
            deadline,
        )
        poll(
            f"the nodes report a fleet of {count}",
            lambda: scraped(args.prometheus, "min(vdet_fleet_nodes)", lambda v: v == count),
            deadline,
        )
        print(f"owner={owner}", flush=True)
    except CheckFailedError as failure:
        print(f"check_fleet: FAIL {failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
