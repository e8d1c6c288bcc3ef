"""The streams file: its format, one-step writes, refusing what vdet did not write, and which
streams start again (`plan_startup`: the config file wins once its entry is edited)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vdet.config.streams import StreamSpec
from vdet.streams.startup import plan_startup
from vdet.streams.store import MAX_STORE_BYTES, StoredStream, StreamStore, StreamStoreError


def spec(stream_id: str, url: str = "rtsp://cam.example/1", **fields: object) -> StreamSpec:
    return StreamSpec.model_validate({"id": stream_id, "url": url, **fields})


def entry(
    stream_id: str, running: StreamSpec | None, configured: StreamSpec | None
) -> StoredStream:
    return StoredStream(id=stream_id, spec=running, configured=configured)


ZONE = {"id": "door", "kind": "polygon", "points": [[0, 0], [0.5, 0], [0.5, 1]]}


def test_a_missing_file_is_an_empty_store(tmp_path: Path) -> None:
    assert StreamStore(tmp_path / "streams.json").load() == {}


def test_save_then_load_gives_the_same_entries_in_order(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "streams.json")
    gate = spec("gate", "rtsp://user:secret@10.0.0.7/1")
    entries = [
        entry("yard", spec("yard", conf_threshold=0.6, zones=[ZONE]), None),
        entry("gate", spec("gate", "rtsp://user:secret@10.0.0.7/1", detect_fps=5), gate),
        entry("dock", None, spec("dock")),
    ]
    store.save(entries)
    loaded = store.load()
    assert list(loaded) == ["yard", "gate", "dock"]
    assert list(loaded.values()) == entries
    # The credentials are kept (the stream must reconnect), so only the owner may read it.
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    body = json.loads(store.path.read_text())
    assert body["version"] == 1 and body["streams"][1]["spec"]["url"].startswith("rtsp://user:")


def test_save_replaces_the_file_in_one_step_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "streams.json")
    store.save([entry("a", spec("a"), None)])
    before = store.path.stat().st_ino
    store.save([entry("b", spec("b"), None)])
    assert list(store.load()) == ["b"]
    assert store.path.stat().st_ino != before  # a new file renamed over the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streams.json"]


def test_a_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    store = StreamStore(tmp_path / "streams.json")
    store.save([entry("a", spec("a"), None)])
    gone = StreamStore(tmp_path / "missing" / "streams.json")
    with pytest.raises(FileNotFoundError):
        gone.save([entry("b", spec("b"), None)])
    assert list(store.load()) == ["a"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid streams file"),
        ('{"version": 2, "streams": []}', "version"),
        ('{"version": 1, "streams": [], "extra": 1}', "extra"),
        ('{"version": 1, "streams": [{"id": "a", "spec": null, "configured": null}]}', "needs"),
        (
            '{"version": 1, "streams": [{"id": "a", "configured": null,'
            ' "spec": {"id": "b", "url": "rtsp://x/1"}}]}',
            "is not the entry's id",
        ),
        (
            '{"version": 1, "streams": [{"id": "a", "configured": null,'
            ' "spec": {"id": "a", "url": "rtsp://x/1", "conf_threshold": 7}}]}',
            "conf_threshold",
        ),
        (
            '{"version": 1, "streams": ['
            '{"id": "a", "configured": null, "spec": {"id": "a", "url": "rtsp://x/1"}},'
            '{"id": "a", "configured": null, "spec": {"id": "a", "url": "rtsp://x/2"}}]}',
            "twice",
        ),
    ],
)
def test_a_file_vdet_did_not_write_is_refused_with_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "streams.json"
    path.write_text(text)
    with pytest.raises(StreamStoreError, match=message) as raised:
        StreamStore(path).load()
    assert str(path) in str(raised.value)


def test_an_oversized_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "streams.json"
    with path.open("wb") as f:
        f.truncate(MAX_STORE_BYTES + 1)
    with pytest.raises(StreamStoreError, match="over"):
        StreamStore(path).load()


def test_a_folder_that_does_not_exist_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(StreamStoreError, match="does not exist"):
        StreamStore(tmp_path / "nowhere" / "streams.json").check_writable()
    StreamStore(tmp_path / "streams.json").check_writable()


def test_one_process_at_a_time_holds_the_file_and_says_who_it_is(tmp_path: Path) -> None:
    path = tmp_path / "streams.json"
    first, second = StreamStore(path), StreamStore(path)
    first.lock()
    first.lock()  # again: already held, nothing changes
    with pytest.raises(StreamStoreError, match=f"in use by another vdet \\(pid {os.getpid()} on "):
        second.lock()
    assert stat.S_IMODE(first.lock_path.stat().st_mode) == 0o600
    first.unlock()
    second.lock()
    second.unlock()
    second.unlock()  # twice: harmless


def test_a_killed_holder_leaves_the_file_free(tmp_path: Path) -> None:
    """The lock is the kernel's (flock): it goes with the process, however that ends."""
    path = tmp_path / "streams.json"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from vdet.streams.store import StreamStore; "
            "StreamStore(pathlib.Path(sys.argv[1])).lock(); print('locked', flush=True); "
            "sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(StreamStoreError, match=f"pid {holder.pid} on "):
            StreamStore(path).lock()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
    store = StreamStore(path)
    store.lock()
    store.unlock()


# ----------------------------------------------------------------------------- plan_startup


def started(configured: list[StreamSpec], stored: list[StoredStream]) -> list[StreamSpec]:
    plan = plan_startup(configured, {e.id: e for e in stored})
    return [item.spec for item in plan.streams]


def test_without_a_file_the_configured_sources_start_as_configured() -> None:
    gate, dock = spec("gate"), spec("dock")
    plan = plan_startup([gate, dock], {})
    assert [(i.spec, i.configured, i.from_file) for i in plan.streams] == [
        (gate, gate, False),
        (dock, dock, False),
    ]
    assert plan.removed == [] and plan.notes == []


def test_api_changes_to_a_configured_source_apply_while_its_entry_is_unchanged() -> None:
    gate = spec("gate")
    changed = spec("gate", conf_threshold=0.7, zones=[ZONE])
    plan = plan_startup([gate], {"gate": entry("gate", changed, gate)})
    (item,) = plan.streams
    assert (item.spec, item.configured, item.from_file) == (changed, gate, True)


def test_an_edited_config_entry_wins_over_older_api_changes() -> None:
    old, edited = spec("gate"), spec("gate", url="rtsp://cam.example/2")
    changed = spec("gate", conf_threshold=0.7)
    plan = plan_startup([edited], {"gate": entry("gate", changed, old)})
    assert [i.spec for i in plan.streams] == [edited]
    assert plan.notes and "config file's entry applies" in plan.notes[0]


def test_a_configured_source_removed_over_the_api_stays_removed() -> None:
    gate, dock = spec("gate"), spec("dock")
    removed = entry("dock", None, dock)
    plan = plan_startup([gate, dock], {"dock": removed})
    assert [i.spec for i in plan.streams] == [gate]
    assert plan.removed == [removed]


def test_a_removed_source_comes_back_when_its_config_entry_is_edited() -> None:
    old, edited = spec("dock"), spec("dock", detect_fps=5)
    assert started([edited], [entry("dock", None, old)]) == [edited]


def test_streams_added_over_the_api_start_after_the_configured_ones_in_file_order() -> None:
    gate = spec("gate")
    yard, lab = spec("yard", "rtsp://cam.example/y"), spec("lab", "rtsp://cam.example/l")
    stored = [entry("yard", yard, None), entry("gate", gate, gate), entry("lab", lab, None)]
    plan = plan_startup([gate], {e.id: e for e in stored})
    assert [(i.spec.id, i.configured, i.from_file) for i in plan.streams] == [
        ("gate", gate, True),
        ("yard", None, True),
        ("lab", None, True),
    ]


def test_a_source_dropped_from_the_config_file_is_not_started_again() -> None:
    dock = spec("dock")
    plan = plan_startup([], {"dock": entry("dock", spec("dock", conf_threshold=0.5), dock)})
    assert plan.streams == [] and plan.removed == []
    assert "no longer in the config file" in plan.notes[0]


def test_a_config_entry_with_the_id_of_an_api_added_stream_wins() -> None:
    configured = spec("yard", "rtsp://cam.example/config")
    posted = spec("yard", "rtsp://cam.example/posted")
    plan = plan_startup([configured], {"yard": entry("yard", posted, None)})
    assert [i.spec for i in plan.streams] == [configured]
    assert "added over the API" in plan.notes[0]
