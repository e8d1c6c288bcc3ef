"""Clips cut from real H.264 packets (ffmpeg-encoded clips, demuxed by PyAV as the readers do):
they decode, start on a keyframe, hold the pre-roll and the post-roll within a frame, merge
overlapping events, and the folder keeps its limits."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import av
import pytest
from support.videos import write_h264_clip

from vdet.clips.recorder import ClipRecorder, ClipWriter
from vdet.clips.ring import PacketRing, RingPacket
from vdet.clips.store import ClipStore
from vdet.config.clips import ClipSettings
from vdet.core.types import ZoneEvent

FPS = 25.0
T0 = 1_700_000_000.0  # arrival of the first packet (unix time)


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 s at 25 fps, a keyframe every 25 frames (1 s)."""
    folder = tmp_path_factory.mktemp("clips")
    return write_h264_clip(
        folder / "cam.mp4", seconds=12.0, size_wh=(160, 96), gop=25, fps=int(FPS)
    )


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.done = threading.Event()

    def __call__(self, source: str, outcome: str, size: int) -> None:
        self.seen.append((source, outcome, size))
        self.done.set()


def event(zone: str = "door", kind: str = "zone_enter") -> ZoneEvent:
    return ZoneEvent(type=kind, zone=zone, track_id=3, class_id=0)  # type: ignore[arg-type]


def feed(recorder: ClipRecorder, path: Path, events_at: dict[int, list[ZoneEvent]]) -> None:
    """Every packet of `path`, arriving 1/FPS apart (as from a camera); after packet N, the
    events of frame N (its arrival)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for index, packet in enumerate(p for p in container.demux(stream) if p.size):
            arrival = T0 + index / FPS
            recorder.on_packet(packet, arrival)
            if index in events_at:
                recorder.on_events(events_at[index], arrival)
    recorder.close()


def frames_of(path: Path) -> tuple[int, bool, float]:
    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
        stream = container.streams.video[0]
        assert stream.time_base is not None
        span = float((frames[-1].pts - frames[0].pts) * stream.time_base) + 1 / FPS
        return len(frames), frames[0].key_frame, span


@pytest.fixture
def store(tmp_path: Path) -> ClipStore:
    return ClipStore(tmp_path / "clips", max_total_bytes=1 << 30, max_age_s=86400 * 365 * 9)


def recorder_for(
    store: ClipStore, outcomes: Outcomes, **settings: object
) -> tuple[ClipRecorder, ClipWriter]:
    spec = ClipSettings(folder=store.folder, **settings)  # type: ignore[arg-type]
    writer = ClipWriter(spec, store, outcomes)
    return ClipRecorder("cam", spec, writer, ["person", "car"]), writer


def test_a_clip_has_its_pre_roll_from_a_keyframe_and_its_post_roll(
    clip_file: Path, store: ClipStore
) -> None:
    outcomes = Outcomes()
    recorder, writer = recorder_for(store, outcomes, pre_roll_s=2.0, post_roll_s=3.0)
    feed(recorder, clip_file, {150: [event()]})  # frame 150: t = 6.0 s
    writer.close()
    (info,) = store.clips("cam")
    assert outcomes.seen == [("cam", "written", info.bytes)]
    found = store.get("cam", info.clip_id)
    assert found is not None
    frames, starts_on_key, span = frames_of(found[1])
    # From the keyframe at or before 4.0 s (frame 100) to the last frame at or before 9.0 s
    # (frame 225): 126 frames, 5.04 s.
    assert starts_on_key and frames == 126 == info.frames
    assert abs(span - 126 / FPS) <= 1 / FPS and abs(info.duration_s - span) <= 1 / FPS
    assert info.start_time == T0 + 100 / FPS and info.end_time == T0 + 225 / FPS
    assert [e.zone for e in info.events] == ["door"] and info.events[0].class_name == "person"
    sidecar = json.loads((store.stream_folder("cam") / f"{info.clip_id}.json").read_text())
    assert sidecar["file"] == f"{info.clip_id}.mp4"


def test_overlapping_events_extend_one_clip_and_later_ones_start_another(
    clip_file: Path, store: ClipStore
) -> None:
    outcomes = Outcomes()
    recorder, writer = recorder_for(store, outcomes, pre_roll_s=1.0, post_roll_s=1.0)
    feed(
        recorder,
        clip_file,
        {50: [event("a")], 70: [event("b")], 90: [event("a", "zone_exit")], 250: [event("c")]},
    )
    writer.close()
    first, second = store.clips("cam")
    assert [e.zone for e in first.events] == ["a", "b", "a"]
    assert first.start_time == T0 + 25 / FPS  # keyframe at or before 1.0 s
    assert first.end_time == T0 + (90 + 25) / FPS  # 1 s after the last event
    assert [e.zone for e in second.events] == ["c"]
    assert second.start_time == T0 + 225 / FPS
    for info in (first, second):
        found = store.get("cam", info.clip_id)
        assert found is not None
        assert frames_of(found[1])[:2] == (info.frames, True)


def test_filters_decide_which_events_make_clips(clip_file: Path, store: ClipStore) -> None:
    outcomes = Outcomes()
    recorder, writer = recorder_for(store, outcomes, zones=["door"], events=["zone_enter"])
    feed(recorder, clip_file, {50: [event("yard")], 100: [event("door", "zone_exit")]})
    writer.close()
    assert store.clips("cam") == [] and outcomes.seen == []


def test_the_ring_keeps_the_pre_roll_from_a_keyframe_within_its_bytes() -> None:
    ring = PacketRing(pre_roll_s=2.0, max_bytes=10_000)
    for i in range(300):  # 30 fps, a keyframe every 30 packets, 100 bytes each
        ring.add(RingPacket(b"x" * 100, i, i, 1, i % 30 == 0, T0 + i / 30))
    kept = list(ring)
    assert kept[0].keyframe and kept[0].arrival <= T0 + 299 / 30 - 2.0
    assert len(kept) <= 90 and ring.bytes == 100 * len(kept)
    tight = PacketRing(pre_roll_s=10.0, max_bytes=5_000)
    for i in range(300):
        tight.add(RingPacket(b"x" * 100, i, i, 1, i % 30 == 0, T0 + i / 30))
    assert tight.bytes <= 5_000 + 3_000 and next(iter(tight)).keyframe  # whole groups only


def test_the_folder_keeps_its_limits_oldest_first(clip_file: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "clips", max_total_bytes=1 << 30, max_age_s=86400 * 365 * 9)
    outcomes = Outcomes()
    recorder, writer = recorder_for(store, outcomes, pre_roll_s=0.5, post_roll_s=0.5)
    feed(recorder, clip_file, {i: [event()] for i in (30, 80, 130, 180, 230)})
    writer.close()
    clips = store.clips("cam")
    assert len(clips) == 5
    sizes = [c.bytes for c in clips]
    store.max_total_bytes = sum(sizes[2:])
    assert store.enforce() == 2
    assert [c.clip_id for c in store.clips("cam")] == [c.clip_id for c in clips[2:]]
    store.max_age_s = 60
    assert store.enforce(now=clips[-1].end_time + 61) == 3 and store.clips("cam") == []
    assert store.usage() == (0, 0)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 KiB tmpfs: room for a small clip, not for a big one."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_refuses_the_clip_cleanly(clip_file: Path, small_disk: Path) -> None:
    store = ClipStore(small_disk, max_total_bytes=1 << 30, max_age_s=86400 * 365 * 9)
    outcomes = Outcomes()
    recorder, writer = recorder_for(store, outcomes, pre_roll_s=0.0, post_roll_s=0.0)
    # A one-group clip fits; then a 10 s one does not: ENOSPC, counted, its parts removed.
    feed(recorder, clip_file, {25: [event("small")]})
    recorder, writer2 = recorder_for(store, outcomes, pre_roll_s=0.0, post_roll_s=10.0)
    feed(recorder, clip_file, {0: [event("big")]})
    writer.close()
    writer2.close()
    assert [o[1] for o in outcomes.seen] == ["written", "disk_full"]
    (kept,) = store.clips("cam")
    assert [e.zone for e in kept.events] == ["small"]
    leftovers = [p.name for p in (small_disk / "cam").iterdir()]
    assert sorted(leftovers) == sorted([kept.file, f"{kept.clip_id}.json"])


def test_events_that_keep_coming_make_consecutive_clips_of_at_most_max_clip_s(
    clip_file: Path, store: ClipStore
) -> None:
    outcomes = Outcomes()
    recorder, writer = recorder_for(
        store, outcomes, pre_roll_s=1.0, post_roll_s=1.0, max_clip_s=4.0
    )
    feed(recorder, clip_file, {i: [event()] for i in range(25, 300, 5)})  # every 0.2 s
    writer.close()
    clips = store.clips("cam")
    assert len(clips) >= 2
    for clip in clips:
        assert clip.end_time - clip.start_time <= 4.0 + 1 / FPS
        assert frames_of(store.get("cam", clip.clip_id)[1])[1]  # type: ignore[index]
    # One after another; a clip starts on a keyframe, so the next may repeat at most the
    # group of pictures (1 s here) in which the last one ended.
    for before, after in itertools.pairwise(clips):
        assert before.end_time - 1.0 <= after.start_time <= before.end_time + 1 / FPS


def test_max_clip_s_leaves_room_for_the_rolls() -> None:
    with pytest.raises(ValueError, match="max_clip_s"):
        ClipSettings(pre_roll_s=5.0, post_roll_s=2.0, max_clip_s=5.0)
