"""The clips folder: one subfolder per stream, each clip a video file and a JSON sidecar that
describes it (times, events, size), written atomically (a temporary name, then a rename: a
reader never sees half a clip), kept within `max_total_bytes` and `max_age_s` (oldest deleted
first). Every process that runs streams writes here and the API process reads it, so a clip
is served whichever process wrote it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vdet.config.clips import ClipSettings
from vdet.config.streams import STREAM_ID_PATTERN

CLIP_ID_PATTERN = r"^[0-9]{13}(-[0-9]{1,3})?$"  # start time in ms, and a counter if taken
_CLIP_ID_RE = re.compile(CLIP_ID_PATTERN)
_STREAM_ID_RE = re.compile(STREAM_ID_PATTERN)
SUFFIX = {"mp4": ".mp4", "matroska": ".mkv"}
MEDIA_TYPE = {".mp4": "video/mp4", ".mkv": "video/x-matroska"}


@dataclass(frozen=True)
class ClipEvent:
    type: str
    zone: str
    class_name: str
    track_id: int
    time: float  # unix time of its frame's arrival
    direction: str | None = None


@dataclass(frozen=True)
class ClipInfo:
    """A kept clip, as its sidecar says."""

    clip_id: str
    source_id: str
    file: str  # the video's name in the stream's folder
    start_time: float  # unix time its first packet arrived
    end_time: float
    duration_s: float  # by the video's own timestamps
    frames: int
    bytes: int
    codec: str
    events: list[ClipEvent] = field(default_factory=list)

    @staticmethod
    def from_json(data: dict[str, Any]) -> ClipInfo:
        events = [ClipEvent(**e) for e in data.get("events", [])]
        return ClipInfo(**{**data, "events": events})


@dataclass(frozen=True)
class _Kept:
    """A kept clip as the folder's names say it, without its sidecar read."""

    source_id: str
    clip_id: str
    video: str
    bytes: int


def clip_path(source_id: str, clip_id: str) -> str:
    """Where a clip is served, relative to the service (its suffix: the file's container)."""
    return f"/v1/streams/{source_id}/clips/{clip_id}"


class ClipStore:
    """A clips folder. Methods are safe from several threads and processes: files appear by
    rename and go by unlink; a listing skips what vanishes under it."""

    def __init__(self, folder: Path, max_total_bytes: int, max_age_s: float) -> None:
        self.folder = folder
        self.max_total_bytes = max_total_bytes
        self.max_age_s = max_age_s

    @classmethod
    def of(cls, settings: ClipSettings) -> ClipStore | None:
        """The store of the `clips` settings; None while clips are off."""
        if settings.folder is None:
            return None
        return cls(settings.folder, settings.max_total_bytes, settings.max_age_s)

    def stream_folder(self, source_id: str) -> Path:
        """The stream's subfolder; ValueError for what is not a stream id ('..' above all: a
        path from a request never leaves the clips folder)."""
        if source_id in {".", ".."} or not _STREAM_ID_RE.match(source_id):
            raise ValueError(f"not a stream id: {source_id!r}")
        return self.folder / source_id

    def new_clip_id(self, source_id: str, start_time: float) -> str:
        base = f"{int(start_time * 1000):013d}"
        taken = {c.clip_id for c in self.clips(source_id)}
        if base not in taken:
            return base
        for n in range(1, 1000):
            if f"{base}-{n}" not in taken:
                return f"{base}-{n}"
        raise OSError(f"too many clips of {source_id} start at {base}")

    def commit(self, info: ClipInfo, video_tmp: Path) -> None:
        """Move a written video in place and write its sidecar (the sidecar last: a clip is
        listed once both are there)."""
        folder = self.stream_folder(info.source_id)
        os.replace(video_tmp, folder / info.file)
        sidecar_tmp = folder / f".{info.clip_id}.json.tmp"
        try:
            sidecar_tmp.write_text(json.dumps(asdict(info)))
            os.replace(sidecar_tmp, folder / f"{info.clip_id}.json")
        except OSError:
            with contextlib.suppress(OSError):
                (folder / info.file).unlink()
            with contextlib.suppress(OSError):
                sidecar_tmp.unlink()
            raise

    def clips(self, source_id: str) -> list[ClipInfo]:
        """The stream's clips, oldest first (none for what is not a stream id)."""
        try:
            folder = self.stream_folder(source_id)
        except ValueError:
            return []
        return sorted(self._infos(folder), key=lambda c: c.start_time)

    def streams(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(e.name for e in os.scandir(self.folder) if e.is_dir())
        return []

    def get(self, source_id: str, clip_id: str) -> tuple[ClipInfo, Path] | None:
        if not _CLIP_ID_RE.match(clip_id):
            return None
        try:
            folder = self.stream_folder(source_id)
        except ValueError:
            return None
        try:
            info = ClipInfo.from_json(json.loads((folder / f"{clip_id}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
        path = folder / info.file
        return (info, path) if path.is_file() else None

    def delete(self, source_id: str, clip_id: str) -> bool:
        found = self.get(source_id, clip_id)
        if found is None:
            return False
        info, path = found
        self._remove(path.parent, info)
        return True

    def usage(self) -> tuple[int, int]:
        """(clips, bytes) kept now, all streams: from names and sizes, no sidecar is read."""
        kept = list(self._kept())
        return len(kept), sum(k.bytes for k in kept)

    def ids(self) -> set[tuple[str, str]]:
        """(stream, clip id) of every clip kept now, from names alone (polled every second)."""
        return {(k.source_id, k.clip_id) for k in self._kept()}

    def enforce(self, now: float | None = None) -> int:
        """Delete clips that started more than `max_age_s` ago, then the oldest until the rest
        fit in `max_total_bytes`; returns how many were deleted. Runs after every clip
        written, so it reads names and sizes only (a clip id is its start time in ms)."""
        now = time.time() if now is None else now
        kept = sorted(self._kept(), key=lambda k: k.clip_id)
        total = sum(k.bytes for k in kept)
        deleted = 0
        for clip in kept:
            old = int(clip.clip_id[:13]) / 1000 < now - self.max_age_s
            if not old and total <= self.max_total_bytes:
                break
            folder = self.stream_folder(clip.source_id)
            for name in (f"{clip.clip_id}.json", clip.video):  # unlisted first, then gone
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            total -= clip.bytes
            deleted += 1
        return deleted

    def _remove(self, folder: Path, info: ClipInfo) -> None:
        for name in (f"{info.clip_id}.json", info.file):  # unlisted first, then gone
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()

    def _kept(self) -> Iterator[_Kept]:
        """Every listed clip (its sidecar is there) with its video's name and size."""
        for source_id in self.streams():
            try:
                entries = list(os.scandir(self.stream_folder(source_id)))
            except (OSError, ValueError):
                continue
            videos: dict[str, tuple[str, int]] = {}
            sidecars: set[str] = set()
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                stem, _, suffix = name.rpartition(".")
                if suffix == "json":
                    sidecars.add(stem)
                elif f".{suffix}" in MEDIA_TYPE:
                    with contextlib.suppress(OSError):
                        videos[stem] = (name, entry.stat().st_size)
            for clip_id in sidecars:
                if clip_id in videos and _CLIP_ID_RE.match(clip_id):
                    video, size = videos[clip_id]
                    yield _Kept(source_id, clip_id, video, size)

    def _infos(self, folder: Path) -> Iterator[ClipInfo]:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            name = entry.name
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                yield ClipInfo.from_json(json.loads(Path(entry.path).read_text()))
            except (OSError, ValueError, TypeError):
                continue  # deleted meanwhile, or not ours
