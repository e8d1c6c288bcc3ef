"""A small RTSP camera for tests: serves one H.264 MP4/MKV file, looped, in real time.

Run it with Debian's /usr/bin/python3 (GStreamer's Python bindings live there, not in the
project's virtual environment):

    /usr/bin/python3 tests/support/rtsp_server.py --file clip.mp4 --port 8554 --name cam

It prints ``READY rtsp://127.0.0.1:<port>/<name>`` on stdout once the server socket listens.

The file is demuxed once into H.264 access units; each client session then gets its own
pipeline, ``appsrc ! h264parse ! rtph264pay name=pay0``, fed those units in a loop with
timestamps that keep increasing across loops (including B-frame reordering, pts and dts are
both shifted), so a client sees a continuous live camera and never an end of stream. The
RTSP server's sinks pace the stream by the timestamps. SIGTERM/SIGINT stop it cleanly; tests
that simulate a camera crash use SIGKILL.

This script must not import anything from the project: it runs in a different interpreter.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sys
from dataclasses import dataclass

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstApp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstApp, GstRtspServer  # noqa: E402


@dataclass(frozen=True)
class AccessUnit:
    data: bytes
    pts: int  # nanoseconds from the start of the clip
    dts: int
    duration: int
    keyframe: bool


def load_access_units(path: str) -> tuple[list[AccessUnit], str, int]:
    """Demux `path` into byte-stream H.264 access units, their caps string and clip length."""
    demuxer = "matroskademux" if path.lower().endswith((".mkv", ".webm")) else "qtdemux"
    pipeline = Gst.parse_launch(
        f"filesrc name=src ! {demuxer} ! h264parse ! "
        "video/x-h264,stream-format=byte-stream,alignment=au ! "
        "appsink name=sink sync=false emit-signals=false"
    )
    pipeline.get_by_name("src").set_property("location", path)
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    units: list[AccessUnit] = []
    caps = ""
    while True:
        sample = sink.emit("pull-sample")  # None at EOS
        if sample is None:
            break
        if not caps:
            caps = sample.get_caps().to_string()
        buf = sample.get_buffer()
        ok, info = buf.map(Gst.MapFlags.READ)
        if not ok:
            raise RuntimeError("could not map a buffer")
        data = bytes(info.data)
        buf.unmap(info)
        pts = buf.pts if buf.pts != Gst.CLOCK_TIME_NONE else buf.dts
        dts = buf.dts if buf.dts != Gst.CLOCK_TIME_NONE else pts
        units.append(
            AccessUnit(
                data=data,
                pts=pts,
                dts=dts,
                duration=buf.duration,
                keyframe=not buf.has_flags(Gst.BufferFlags.DELTA_UNIT),
            )
        )
    bus = pipeline.get_bus()
    err = bus.pop_filtered(Gst.MessageType.ERROR)
    pipeline.set_state(Gst.State.NULL)
    if err is not None:
        gerror, debug = err.parse_error()
        raise RuntimeError(f"cannot demux {path}: {gerror.message} ({debug})")
    if not units:
        raise RuntimeError(f"no H.264 video found in {path}")
    frame_ns = _frame_duration(units)
    units = [u if u.duration != Gst.CLOCK_TIME_NONE else _with_duration(u, frame_ns) for u in units]
    first = min(u.dts for u in units)
    units = [
        AccessUnit(u.data, u.pts - first, u.dts - first, u.duration, u.keyframe) for u in units
    ]
    # One loop lasts the span of presentation times, so the next pass starts one frame after
    # the last frame shown (dts may start earlier than pts when the clip has B-frames).
    clip_ns = max(u.pts + u.duration for u in units) - min(u.pts for u in units)
    return units, caps, clip_ns


def _frame_duration(units: list[AccessUnit]) -> int:
    pts = sorted(u.pts for u in units)
    deltas = [b - a for a, b in itertools.pairwise(pts) if b > a]
    return min(deltas) if deltas else Gst.SECOND // 30


def _with_duration(u: AccessUnit, duration: int) -> AccessUnit:
    return AccessUnit(u.data, u.pts, u.dts, duration, u.keyframe)


class LoopingSource:
    """Feeds one appsrc the clip's access units forever (or once, without loop)."""

    def __init__(self, units: list[AccessUnit], clip_ns: int, loop: bool) -> None:
        self.units = units
        self.clip_ns = clip_ns
        self.loop = loop
        self.position = 0
        self.offset = 0
        self.finished = False

    def on_need_data(self, src: GstApp.AppSrc, _length: int) -> None:
        # Push a handful per callback; the queue limit on appsrc keeps memory bounded and
        # the sinks' clock sync keeps the pace real time.
        for _ in range(8):
            if self.finished:
                return
            if self.position == len(self.units):
                if not self.loop:
                    self.finished = True
                    src.end_of_stream()
                    return
                self.position = 0
                self.offset += self.clip_ns
            unit = self.units[self.position]
            self.position += 1
            buf = Gst.Buffer.new_wrapped(unit.data)
            buf.pts = unit.pts + self.offset
            buf.dts = unit.dts + self.offset
            buf.duration = unit.duration
            if not unit.keyframe:
                buf.set_flags(Gst.BufferFlags.DELTA_UNIT)
            if src.push_buffer(buf) != Gst.FlowReturn.OK:
                return


class RtpDropper:
    """Drops every `every`-th RTP packet the payloader sends after the first `after` of a
    session: a lossy link under the RTSP session (its RTP sequence numbers show the gap).

    rtph264pay pushes buffer lists (one per access unit); a list that loses a packet is
    pushed again without it and the original dropped."""

    def __init__(self, every: int, after: int) -> None:
        self.every = every
        self.after = after
        self.sent = 0
        self.dropped = 0
        self._pushing = False

    def _lose_next(self) -> bool:
        self.sent += 1
        if self.sent > self.after and (self.sent - self.after) % self.every == 0:
            self.dropped += 1
            return True
        return False

    def on_data(self, pad: Gst.Pad, info: Gst.PadProbeInfo) -> Gst.PadProbeReturn:
        if self._pushing:
            return Gst.PadProbeReturn.OK
        if not info.type & Gst.PadProbeType.BUFFER_LIST:
            return Gst.PadProbeReturn.DROP if self._lose_next() else Gst.PadProbeReturn.OK
        packets = info.get_buffer_list()
        kept = [packets.get(i) for i in range(packets.length()) if not self._lose_next()]
        if len(kept) == packets.length():
            return Gst.PadProbeReturn.OK
        if kept:
            rest = Gst.BufferList.new_sized(len(kept))
            for packet in kept:
                rest.insert(-1, packet)
            self._pushing = True
            try:
                pad.push_list(rest)
            finally:
                self._pushing = False
        return Gst.PadProbeReturn.DROP


class LoopingFactory(GstRtspServer.RTSPMediaFactory):
    def __init__(
        self,
        units: list[AccessUnit],
        caps: str,
        clip_ns: int,
        loop: bool,
        drop_rtp: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.units = units
        self.clip_ns = clip_ns
        self.loop = loop
        self.drop_rtp = drop_rtp
        self.set_launch(
            f'( appsrc name=src format=time max-buffers=16 block=false caps="{caps}" ! '
            "h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 )"
        )
        self.set_shared(False)
        self.connect("media-configure", self._on_media_configure)

    def _on_media_configure(
        self, _factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia
    ) -> None:
        src = media.get_element().get_by_name_recurse_up("src")
        feeder = LoopingSource(self.units, self.clip_ns, self.loop)
        src.connect("need-data", feeder.on_need_data)
        # Keep the feeder (and the dropper) alive as long as the media lives.
        media._vdet_feeder = feeder  # type: ignore[attr-defined]
        if self.drop_rtp is not None:
            dropper = RtpDropper(*self.drop_rtp)
            pay = media.get_element().get_by_name_recurse_up("pay0")
            pay.get_static_pad("src").add_probe(
                Gst.PadProbeType.BUFFER | Gst.PadProbeType.BUFFER_LIST, dropper.on_data
            )
            media._vdet_dropper = dropper  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True, help="H.264 MP4 or MKV file to serve")
    parser.add_argument("--port", type=int, required=True, help="TCP port, on 127.0.0.1")
    parser.add_argument("--name", default="cam", help="mount path: rtsp://host:port/<name>")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--no-loop", action="store_true", help="end the stream after one pass")
    parser.add_argument(
        "--drop-rtp",
        nargs=2,
        type=int,
        metavar=("EVERY", "AFTER"),
        help="drop every EVERY-th RTP packet of a session after its first AFTER",
    )
    args = parser.parse_args(argv)

    Gst.init(None)
    units, caps, clip_ns = load_access_units(args.file)

    server = GstRtspServer.RTSPServer()
    server.set_address(args.host)
    server.set_service(str(args.port))
    drop_rtp = (args.drop_rtp[0], args.drop_rtp[1]) if args.drop_rtp else None
    factory = LoopingFactory(units, caps, clip_ns, loop=not args.no_loop, drop_rtp=drop_rtp)
    server.get_mount_points().add_factory(f"/{args.name}", factory)
    if server.attach(None) == 0:
        print(f"cannot listen on {args.host}:{args.port}", file=sys.stderr, flush=True)
        return 2

    main_loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, signum, _quit, main_loop)
    print(f"READY rtsp://{args.host}:{args.port}/{args.name}", flush=True)
    main_loop.run()
    return 0


def _quit(main_loop: GLib.MainLoop) -> bool:
    main_loop.quit()
    return GLib.SOURCE_REMOVE


if __name__ == "__main__":
    sys.exit(main())
