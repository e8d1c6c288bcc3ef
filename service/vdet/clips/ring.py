"""A stream's recent compressed packets: what a clip's pre-roll is cut from.

The ring keeps every packet since the last keyframe at or before `pre_roll_s` ago (by arrival
time), so that a clip asked for now can start on a keyframe at least that far back. Memory is
bounded by `max_bytes`: beyond it whole groups of pictures leave from the old end (the newest
group always stays). At 4 Mbit/s a 10 s pre-roll with a keyframe every 2 s holds about 6 MB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RingPacket:
    """One compressed video packet, copied out of the demuxer, with its arrival time."""

    data: bytes
    pts: int | None
    dts: int | None
    duration: int
    keyframe: bool
    arrival: float  # unix time the packet was read


class PacketRing:
    """Packets of one connection, oldest first, in groups of pictures (each starts with a
    keyframe). Not thread-safe: its recorder locks."""

    def __init__(self, pre_roll_s: float, max_bytes: int) -> None:
        self.pre_roll_s = pre_roll_s
        self.max_bytes = max_bytes
        self._groups: deque[list[RingPacket]] = deque()
        self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups)

    def __iter__(self) -> Iterator[RingPacket]:
        for group in self._groups:
            yield from group

    def add(self, packet: RingPacket) -> None:
        if packet.keyframe:
            self._groups.append([packet])
        elif self._groups:
            self._groups[-1].append(packet)
        else:
            return  # nothing decodes before the first keyframe
        self._bytes += len(packet.data)
        self._trim(packet.arrival - self.pre_roll_s)

    def clear(self) -> None:
        self._groups.clear()
        self._bytes = 0

    def since(self, moment: float, after: float | None = None) -> list[RingPacket]:
        """The packets from the last keyframe that arrived at or before `moment` (else the
        oldest kept, a keyframe) to the newest. With `after` (where the previous clip ended),
        not from before it: from the first keyframe after it when that one is not later than
        `moment`'s, so that consecutive clips do not repeat each other's video."""
        groups = list(self._groups)
        start = 0
        for index, group in enumerate(groups):
            if group[0].arrival > moment:
                break
            start = index
        if after is not None and groups and groups[start][0].arrival <= after:
            later = [i for i, g in enumerate(groups) if g[0].arrival > after]
            if later:
                start = later[0]
        return [packet for group in groups[start:] for packet in group]

    def _trim(self, keep_from: float) -> None:
        """Drop groups from the old end while the next group still starts at or before
        `keep_from`, or while over `max_bytes` (never the newest group)."""
        groups = self._groups
        while len(groups) > 1 and (
            groups[1][0].arrival <= keep_from or self._bytes > self.max_bytes
        ):
            self._bytes -= sum(len(p.data) for p in groups.popleft())
