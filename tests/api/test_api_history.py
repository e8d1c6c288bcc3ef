"""The event history and the zone counts through the real app (ONNX Runtime, a real H.264
clip): a zone over the whole frame and a line across it make events; GET /v1/events/history
returns them newest first, filtered and paged without loss or repeats, and
GET /v1/streams/{id}/counts says what the metrics say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.apptest import MakeSettings, TestClient, stream_body
from support.waiting import wait_until

from vdet.api.app import create_app
from vdet.metrics.registry import Metrics
from vdet.results.history import EventHistory, EventQuery
from vdet.results.hub import EncodedResult

WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
ACROSS = {"id": "mid", "kind": "line", "points": [[0.5, 0], [0.5, 1]]}


def history(client: TestClient, query: str = "") -> dict[str, Any]:
    r = client.get(f"/v1/events/history{query}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_history_filters_and_pages_the_events_of_every_stream(
    make_settings: MakeSettings, clip: Path
) -> None:
    settings = make_settings(
        sources=[
            stream_body(clip, "gate", zones=[WHOLE_FRAME, ACROSS]),
            stream_body(clip, "dock", zones=[WHOLE_FRAME]),
        ]
    )
    with TestClient(create_app(settings)) as client:
        wait_until(
            lambda: (
                {e["source_id"] for e in history(client, "?limit=500")["events"]}
                == {"gate", "dock"}
            ),
            30,
            what="events of both streams",
        )
        client.delete("/v1/streams/gate")  # the history stays still from here on
        client.delete("/v1/streams/dock")
        everything = history(client, "?limit=500")
        events = everything["events"]
        assert everything["kept"] == len(events) and everything["next_before_id"] is None
        ids = [e["id"] for e in events]
        assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
        assert {e["type"] for e in events} >= {"zone_enter"}
        first = events[-1]
        assert first["snapshot"] == (
            f"/v1/streams/{first['source_id']}/snapshots/{first['frame_index']}.jpg"
        )
        # Pages of 3 give every event once, in the same order.
        paged: list[int] = []
        cursor = ""
        while True:
            page = history(client, f"?limit=3{cursor}")
            paged += [e["id"] for e in page["events"]]
            if page["next_before_id"] is None:
                break
            cursor = f"&before_id={page['next_before_id']}"
        assert paged == ids
        # Filters: each gives exactly the matching events.
        gate = history(client, "?stream=gate&limit=500")["events"]
        assert gate == [e for e in events if e["source_id"] == "gate"]
        enters = history(client, "?type=zone_enter&zone=all&limit=500")["events"]
        assert enters == [e for e in events if e["type"] == "zone_enter" and e["zone"] == "all"]
        name = events[0]["class_name"]
        assert history(client, f"?class_name={name}&limit=500")["events"] == [
            e for e in events if e["class_name"] == name
        ]
        middle = sorted(e["time"] for e in events)[len(events) // 2]
        assert history(client, f"?since={middle}&limit=500")["events"] == [
            e for e in events if e["time"] >= middle
        ]
        assert history(client, "?stream=nobody")["events"] == []
        for bad in ("?limit=0", "?limit=501", "?type=zone_party", "?since=nan", "?stream=a%20b"):
            assert client.get(f"/v1/events/history{bad}").status_code == 422, bad


def test_counts_say_what_the_metrics_say(make_settings: MakeSettings, clip: Path) -> None:
    settings = make_settings(sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME, ACROSS])])
    with TestClient(create_app(settings)) as client:

        def counts() -> dict[str, Any]:
            r = client.get("/v1/streams/gate/counts")
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

        inside = wait_until(lambda: counts()["objects"].get("all"), 30, what="tracks in the zone")
        gauges = {
            s.labels["class"]: s.value
            for f in text_string_to_metric_families(client.get("/metrics").text)
            if f.name == "vdet_zone_objects"
            for s in f.samples
            if s.labels["source"] == "gate" and s.labels["zone"] == "all"
        }
        assert inside == {name: int(value) for name, value in gauges.items()}
        assert client.get("/v1/streams/nope/counts").status_code == 404


def test_counts_of_lines_by_direction_and_class() -> None:
    metrics = Metrics()
    metrics.line_crossings.labels("gate", "mid", "car", "in").inc(3)
    metrics.line_crossings.labels("gate", "mid", "person", "out").inc()
    metrics.line_crossings.labels("dock", "mid", "car", "in").inc()
    metrics.zone_objects.labels("gate", "yard", "car").set(2)
    counts = metrics.zone_counts("gate")
    assert counts.crossings == {"mid": {"in": {"car": 3}, "out": {"person": 1}}}
    assert counts.objects == {"yard": {"car": 2}}


def test_the_history_keeps_the_newest_and_skips_results_without_events() -> None:
    history = EventHistory(3, ("person", "car"))
    quiet = EncodedResult(1, "cam", 0, ',"source_id":"cam","events":[],"timings_ms":{}}}')
    history.add(quiet)
    assert history.query(EventQuery()).kept == 0
