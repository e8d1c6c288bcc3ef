"""Media robustness through `vdet serve`: a matrix of streams made from the sample clip, each
decoded with `gpu.decoder` auto (NVDEC where it and the pipeline take the sequence) and with
`gpu.decoder` cpu, side by side, scored against the sample's truth.

1. The cases are made here, by the package's generator (vdet.modelkit.dataset.media_cases,
   PyAV with FFmpeg's encoders), from the first `--frames` frames of the sample clip: frame
   `i` of a case is frame `i` of the sample, scaled to the case's size, so the sample's truth
   scores it (boxes times the scale).
2. For each decoder setting one installed `vdet serve` (the backend `auto` picks: the torch
   backend on a GPU, ONNX Runtime on a CPU machine) gets every case over REST as an unpaced
   file stream (`realtime: false`, no loop); a WebSocket client reads every result from
   `/v1/events` until each stream has ended; then each stream's status is read.
3. Per case and decoder: the decode path and its reason, the end state, frames decoded,
   processed, damaged and dropped, decode errors, recall (class-aware, IoU 0.5, countable
   objects) over the frames with results, and false boxes per frame at score >= 0.5 (boxes
   that match no truth object of their class at IoU 0.5).

The RTSP cases are served by the project's RTSP test camera (GStreamer's RTSP server,
tests/support/rtsp_server.py, run as a program under `--rtsp-python`: Debian's Python with
GStreamer's bindings, or the folder bench/gpu/pack_rtsp_camera.sh packs), one pass of the
whole sample clip in real time over RTSP/TCP: once without two pictures (every RTP packet of
them lost), once losing single RTP packets inside pictures. A live stream has no end: its first
pass is scored, up to the moment the server sees the camera's end of stream.

    python3 bench/gpu/media_matrix.py --out media.json [--frames 150] [--decoders auto cpu]
        [--rtsp-python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import av
import yaml
from websockets.sync.client import connect

from vdet.core.assets import sample_clip
from vdet.modelkit.dataset.clip_truth import hits, iou, sample_truth
from vdet.modelkit.dataset.media_cases import (
    drop_frames,
    reencode,
    remux,
    resize_midway_ts,
    truncate,
    write_lossy_ts,
)

FULL = (1920, 1080)
# The frames the "whole frames lost" case leaves out (decode order = display order: IPPP).
LOST_FRAMES = frozenset({40, 41, 100})
# The RTSP cases: what the camera loses (rtsp_server.py --drop-rtp EVERY AFTER: every 400th
# RTP packet after the first 300 of the session, about one every 2 s of the sample clip).
RTSP_CASES: dict[str, tuple[int, int] | None] = {
    "h264 rtsp, whole frames lost": None,
    "h264 rtsp, RTP packets lost": (400, 300),
}
CAMERA = Path(__file__).resolve().parents[2] / "tests" / "support" / "rtsp_server.py"
Maker = Callable[[Path, Path, int], object]  # (sample, case file, frames): writes the case


def _cases() -> dict[str, tuple[Maker, tuple[int, int]]]:
    """Case name -> (how to make it from the sample, the size its truth scales to)."""

    def enc(encoder: str, pix_fmt: str, **kw: Any) -> Maker:
        def make(src: Path, dst: Path, frames: int) -> object:
            return reencode(src, dst, encoder, pix_fmt, frames=frames, **kw)

        return make

    fast = {"preset": "veryfast", "crf": "23"}
    x265 = {"preset": "ultrafast", "crf": "26"}
    return {
        "h264 8-bit mp4 (sample)": (
            lambda s, d, n: reencode(s, d, "libx264", "yuv420p", frames=n, options=fast),
            FULL,
        ),
        "h264 mpeg-ts": (lambda s, d, n: remux(s, d, "mpegts"), FULL),
        "h264 mpeg-ts, packets lost": (lambda s, d, n: write_lossy_ts(s, d), FULL),
        "h264 mpeg-ts, whole frames lost": (
            lambda s, d, n: drop_frames(s, d, set(LOST_FRAMES), "mpegts"),
            FULL,
        ),
        "h264 mpeg-ts truncated at 60%": (
            lambda s, d, n: truncate(remux(s, d.with_suffix(".whole.ts"), "mpegts"), d, 0.6),
            FULL,
        ),
        "h264 B-frames": (enc("libx264", "yuv420p", options={**fast, "bf": "3"}), FULL),
        "h264 10-bit": (enc("libx264", "yuv420p10le", options=fast), FULL),
        "h264 4:2:2": (enc("libx264", "yuv422p", options=fast), FULL),
        "h264 interlaced": (
            enc("libx264", "yuv420p", options={**fast, "flags": "+ilme+ildct"}),
            FULL,
        ),
        "h264 1366x768": (enc("libx264", "yuv420p", size=(1366, 768), options=fast), (1366, 768)),
        "h264 size change 1080p -> 720p": (
            lambda s, d, n: (
                resize_midway_ts(s, d, [(0, FULL), (n // 2, (1280, 720))], frames=n) and None
            ),
            FULL,
        ),
        "h264 display rotation 90 (metadata only)": (
            enc("libx264", "yuv420p", options=fast, rotation=90),
            FULL,
        ),
        "hevc 8-bit": (enc("libx265", "yuv420p", options=x265), FULL),
        "hevc 10-bit (Main10)": (enc("libx265", "yuv420p10le", options=x265), FULL),
        "hevc 4:4:4": (enc("libx265", "yuv444p", options=x265), FULL),
        "mpeg4 part 2": (enc("mpeg4", "yuv420p", options={"qscale": "4"}), FULL),
        "mpeg-2": (enc("mpeg2video", "yuv420p", options={"qscale": "4"}), FULL),
        "vp9": (
            enc("libvpx-vp9", "yuv420p", options={"deadline": "realtime", "cpu-used": "8"}),
            FULL,
        ),
        "av1": (enc("libsvtav1", "yuv420p", options={"preset": "12"}), FULL),
        "mjpeg": (
            enc("mjpeg", "yuvj420p", options={"qscale": "4"}, container_format="matroska"),
            FULL,
        ),
        "h264 rtsp, whole frames lost": (
            lambda s, d, n: drop_frames(s, d, set(LOST_FRAMES)),
            FULL,
        ),
        "h264 rtsp, RTP packets lost": (lambda s, d, n: remux(s, d), FULL),
    }


def _suffix(name: str) -> str:
    return (
        ".ts"
        if "mpeg-ts" in name or "size change" in name
        else ".mkv"
        if "mjpeg" in name or "vp9" in name
        else ".mp4"
    )


def make_cases(folder: Path, frames: int, only: list[str] | None) -> dict[str, dict[str, Any]]:
    source = sample_clip()
    made: dict[str, dict[str, Any]] = {}
    for index, (name, (maker, size)) in enumerate(_cases().items()):
        if only and not any(word in name for word in only):
            continue
        path = folder / f"case{index:02d}{_suffix(name)}"
        started = time.monotonic()
        try:
            maker(source, path, frames)
        except Exception as exc:  # an encoder this build lacks: reported, not fatal
            made[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        made[name] = {
            "path": str(path),
            "bytes": path.stat().st_size,
            "scale": size[0] / FULL[0],
            "make_s": round(time.monotonic() - started, 1),
        }
        if "size change" in name:
            made[name]["scale_from"] = (frames // 2, 1280 / FULL[0])
        if "whole frames lost" in name:
            made[name]["lost"] = sorted(LOST_FRAMES)
        if name in RTSP_CASES:
            made[name]["drop_rtp"] = RTSP_CASES[name]
            with av.open(str(source)) as container:  # the sample's rate (a cut file's is off)
                made[name]["fps"] = float(container.streams.video[0].average_rate or 30)
            with av.open(str(path)) as container:  # one pass: the frames of the file
                video = container.streams.video[0]
                made[name]["pass_frames"] = sum(1 for p in container.demux(video) if p.size)
    return made


def start_cameras(
    cases: dict[str, dict[str, Any]], python: str, workdir: Path
) -> list[subprocess.Popen[bytes]]:
    """An RTSP camera for each RTSP case (its `url` set), or the case's `error`."""
    cameras: list[subprocess.Popen[bytes]] = []
    for index, (name, case) in enumerate(cases.items()):
        if name not in RTSP_CASES or "path" not in case:
            continue
        port = _free_port()
        drop = case.get("drop_rtp")
        command = [python, str(CAMERA), "--file", case["path"], "--port", str(port)]
        command += ["--name", f"case{index:02d}", "--no-loop"]
        command += ["--drop-rtp", *map(str, drop)] if drop else []
        log = (workdir / f"camera{index:02d}.log").open("wb")
        camera = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        cameras.append(camera)
        deadline = time.monotonic() + 30
        while not _port_open(port):
            if camera.poll() is not None or time.monotonic() > deadline:
                case["error"] = f"the RTSP camera did not start (see {log.name})"
                break
            time.sleep(0.1)
        else:
            case["url"] = f"rtsp://127.0.0.1:{port}/case{index:02d}"
    return cameras


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(port: int, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        text = answer.read()
    return json.loads(text) if text else None


_LIVE = ("connecting", "streaming")


def serve_matrix(
    cases: dict[str, dict[str, Any]], decoder: str, workdir: Path, timeout_s: float
) -> dict[str, Any]:
    """One server with `gpu.decoder` = `decoder`; every case as a stream; results and status."""
    port = _free_port()
    folder = str(Path(next(iter(cases.values()))["path"]).parent)
    config = {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "max_streams": 64,
        "gpu": {"decoder": decoder},
        "ingest": {"source_policy": {"file_roots": [folder]}},
    }
    config_path = workdir / f"vdet-{decoder}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    vdet = str(Path(sys.executable).parent / "vdet")
    log = (workdir / f"serve-{decoder}.log").open("wb")
    server = subprocess.Popen(
        [vdet, "serve", "--config", str(config_path)], env=env, stdout=log, stderr=log
    )
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                ready = _http(port, "GET", "/readyz")
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    log.flush()
                    tail = (workdir / f"serve-{decoder}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"vdet serve ({decoder}) did not start:\n{tail}") from None
                time.sleep(1)
        ids = {name: f"case{i:02d}" for i, name in enumerate(cases)}
        with connect(f"ws://127.0.0.1:{port}/v1/events", max_size=None) as ws:
            for name, case in cases.items():
                _http(
                    port,
                    "POST",
                    "/v1/streams",
                    {"id": ids[name], "url": case.get("url", case["path"]), "realtime": False},
                )
            live = {ids[name] for name, case in cases.items() if "url" in case}
            pass_frames = {ids[n]: c["pass_frames"] for n, c in cases.items() if "url" in c}
            # A live stream's first pass ends where the server sees the camera's end of
            # stream; its status then is kept and the stream removed (it would reconnect).
            passed: dict[str, dict[str, Any]] = {}
            ended: set[str] = set()
            stop_at = time.monotonic() + timeout_s
            last_poll = 0.0
            while len(ended) < len(ids) and time.monotonic() < stop_at:
                try:
                    message = json.loads(ws.recv(timeout=1.0))
                    if message.get("type") == "result":
                        result = message["result"]
                        sid = result["source_id"]
                        # A live stream's results from its first pass only.
                        if sid not in passed and result["frame_index"] < pass_frames.get(sid, 1e9):
                            results.setdefault(sid, []).append(result)
                except TimeoutError:
                    pass
                if time.monotonic() - last_poll > 1:
                    last_poll = time.monotonic()
                    for stream in _http(port, "GET", "/v1/streams")["streams"]:
                        sid, status = stream["id"], stream["status"]
                        if sid not in live:
                            if status["state"] in ("stopped", "failed"):
                                ended.add(sid)
                        elif sid not in passed and (
                            status["attempts"] > 1
                            or (status["frames_decoded"] and status["state"] not in _LIVE)
                        ):
                            passed[sid] = status
                            ended.add(sid)
                            _http(port, "DELETE", f"/v1/streams/{sid}")
            time.sleep(1)
        statuses = {s["id"]: s["status"] for s in _http(port, "GET", "/v1/streams")["streams"]}
        statuses.update(passed)
        ready = _http(port, "GET", "/readyz")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    out: dict[str, Any] = {
        "backend": ready.get("backend"),
        "data_path": ready.get("data_path"),
        "streams_decoded_on_cpu": ready.get("streams_decoded_on_cpu"),
        "cases": {},
    }
    for name, case in cases.items():
        sid = ids[name]
        out["cases"][name] = score(case, statuses.get(sid, {}), results.get(sid, []))
    return out


def _source_index(index: int, lost: list[int]) -> int:
    """The sample's frame that a case's frame `index` is, when the case left out the sample's
    frames `lost` (sorted)."""
    for gone in lost:
        if gone <= index:
            index += 1
    return index


def score(
    case: dict[str, Any], status: dict[str, Any], results: list[dict[str, Any]]
) -> dict[str, Any]:
    truth = sample_truth()
    found = total = false_boxes = 0
    for result in results:
        if "url" in case:
            # A live stream's first frames are the probe's, not passed on (fflags nobuffer):
            # the sample's frame is told by the timestamp, which the camera keeps from the file.
            index = round(result["pts_s"] * case["fps"])
        else:
            index = _source_index(result["frame_index"], case.get("lost", []))
        scale = case["scale"]
        if "scale_from" in case and index >= case["scale_from"][0]:
            scale = case["scale_from"][1]
        detections = [{**d, "box": [v / scale for v in d["box"]]} for d in result["detections"]]
        f, t = hits(index, detections, truth)
        found, total = found + f, total + t
        objects = truth["frames"][index % len(truth["frames"])]["objects"]
        false_boxes += sum(
            1
            for d in detections
            if d["score"] >= 0.5
            and not any(
                o["class_id"] == d["class_id"] and iou(d["box"], o["box"]) >= 0.5 for o in objects
            )
        )
    keys = (
        "state",
        "decode_path",
        "decode_reason",
        "frames_decoded",
        "frames_processed",
        "frames_damaged",
        "frames_dropped",
        "decode_errors",
        "last_error",
    )
    return {
        **{k: status.get(k) for k in keys},
        "results": len(results),
        "recall": round(found / total, 4) if total else None,
        "false_boxes_per_frame": round(false_boxes / len(results), 3) if results else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--decoders", nargs="+", default=["auto", "cpu"])
    parser.add_argument(
        "--only", nargs="*", help="cases whose name contains one of these words (default: all)"
    )
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per server")
    parser.add_argument(
        "--rtsp-python",
        default=os.environ.get("RTSP_CAMERA_PYTHON", "/usr/bin/python3"),
        help="the Python that runs the RTSP camera (GStreamer's bindings importable)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="vdet-media-"))
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "frames": args.frames,
    }
    made = make_cases(workdir, args.frames, args.only)
    cameras = start_cameras(made, args.rtsp_python, workdir)
    report["cases"] = {
        name: {k: v for k, v in c.items() if k != "path"} for name, c in made.items()
    }
    print(json.dumps(report["cases"], indent=1), flush=True)
    usable = {name: c for name, c in made.items() if "path" in c and "error" not in c}
    try:
        for decoder in args.decoders:
            report[f"decoder {decoder}"] = serve_matrix(usable, decoder, workdir, args.timeout)
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        for camera in cameras:
            camera.terminate()
            camera.wait(timeout=10)
    for name in usable:
        row = [name]
        for decoder in args.decoders:
            r = report[f"decoder {decoder}"]["cases"][name]
            row.append(
                f"{decoder}: {r['decode_path']} {r['state']} dec={r['frames_decoded']} "
                f"proc={r['frames_processed']} dmg={r['frames_damaged']} rec={r['recall']} "
                f"fp={r['false_boxes_per_frame']}"
            )
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
