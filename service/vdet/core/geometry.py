"""Plane geometry of zones and lines: point in polygon, segment crossing, simple polygons.

Plain NumPy on float64 points in pixels. A point on a polygon's edge counts as inside, so an
object standing on a zone's border is in it; a point exactly on a line is on neither side, so
jitter along a line cannot count as a crossing. Nothing here knows about tracks or streams.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Points = npt.NDArray[np.float64]  # (N, 2) x, y
_EPS = 1e-9


def _cross(o: Points, a: Points, b: Points) -> npt.NDArray[np.float64]:
    """z of (a - o) x (b - o), broadcast over leading axes."""
    out: npt.NDArray[np.float64] = (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (
        a[..., 1] - o[..., 1]
    ) * (b[..., 0] - o[..., 0])
    return out


class Polygon:
    """A polygon's edges, prepared once, for testing many points each frame."""

    def __init__(self, vertices: Points) -> None:
        a = np.asarray(vertices, np.float64)
        b = np.roll(a, -1, axis=0)
        self.ax, self.ay, self.bx, self.by = a[:, 0], a[:, 1], b[:, 0], b[:, 1]
        dy = self.by - self.ay
        # x where each edge meets a horizontal line, as ax + (y - ay) * slope; horizontal
        # edges never straddle one, so their slope is never used.
        self.slope = np.divide(self.bx - self.ax, dy, out=np.zeros_like(dy), where=dy != 0)
        self.lo_x, self.hi_x = np.minimum(self.ax, self.bx), np.maximum(self.ax, self.bx)
        self.lo_y, self.hi_y = np.minimum(self.ay, self.by), np.maximum(self.ay, self.by)
        self.tolerance = _EPS * np.maximum(1.0, np.abs(self.bx - self.ax) + np.abs(dy))

    def contains(self, points: Points) -> npt.NDArray[np.bool_]:
        """Which of `points` (N, 2) lie inside or on the boundary.

        Even-odd crossing number (right for concave polygons), plus an exact on-edge test.
        """
        if len(points) == 0:
            return np.zeros(0, np.bool_)
        px, py = points[:, 0:1], points[:, 1:2]  # (N, 1) against (V,) edges
        straddles = (self.ay > py) != (self.by > py)
        x_at = self.ax + (py - self.ay) * self.slope
        inside = np.count_nonzero(straddles & (px < x_at), axis=1) % 2 == 1
        cross = (self.bx - self.ax) * (py - self.ay) - (self.by - self.ay) * (px - self.ax)
        on_edge = (
            (np.abs(cross) <= self.tolerance)
            & (px >= self.lo_x - _EPS)
            & (px <= self.hi_x + _EPS)
            & (py >= self.lo_y - _EPS)
            & (py <= self.hi_y + _EPS)
        ).any(axis=1)
        result: npt.NDArray[np.bool_] = inside | on_edge
        return result


def points_in_polygon(points: Points, polygon: Points) -> npt.NDArray[np.bool_]:
    """Which of `points` (N, 2) lie inside `polygon` (V, 2) or on its boundary."""
    return Polygon(polygon).contains(points)


def side_of_line(points: Points, a: Points, b: Points) -> npt.NDArray[np.int8]:
    """+1 right of a -> b as seen on the image (y down), -1 left, 0 on the line."""
    z = _cross(a, b, points)
    side: npt.NDArray[np.int8] = np.sign(np.where(np.abs(z) <= _EPS, 0.0, z)).astype(np.int8)
    return side


def segments_intersect(p: Points, q: Points, a: Points, b: Points) -> npt.NDArray[np.bool_]:
    """Whether each segment p[i] -> q[i] meets segment a -> b (touching counts)."""
    d1, d2 = _cross(a, b, p), _cross(a, b, q)
    d3, d4 = _cross(p, q, a), _cross(p, q, b)
    proper = (d1 * d2 <= 0) & (d3 * d4 <= 0)
    # Collinear segments: overlap of their extents.
    both_collinear = (np.abs(d1) <= _EPS) & (np.abs(d2) <= _EPS)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    plo, phi = np.minimum(p, q), np.maximum(p, q)
    overlap = ((plo <= hi + _EPS) & (phi >= lo - _EPS)).all(axis=-1)
    result: npt.NDArray[np.bool_] = np.where(both_collinear, overlap, proper)
    return result


def polygon_area(polygon: Points) -> float:
    """Signed area (shoelace); positive for clockwise vertices on a y-down image."""
    x, y = polygon[:, 0], polygon[:, 1]
    return float(0.5 * (np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def self_intersection(polygon: Sequence[Sequence[float]]) -> tuple[int, int] | None:
    """The first pair of non-adjacent edges (i, j) that meet, or None for a simple polygon.

    Edge i runs from vertex i to vertex i+1 (the last one back to vertex 0); adjacent edges
    share a vertex and are not compared, except when they fold back onto each other.
    """
    pts = np.asarray(polygon, np.float64)
    n = len(pts)
    starts, ends = pts, np.roll(pts, -1, axis=0)
    for i in range(n):
        others = [j for j in range(i + 1, n) if j != i + 1 and not (i == 0 and j == n - 1)]
        if others:
            idx = np.asarray(others)
            hit = segments_intersect(
                np.repeat(starts[i : i + 1], len(idx), axis=0),
                np.repeat(ends[i : i + 1], len(idx), axis=0),
                starts[idx],
                ends[idx],
            )
            if hit.any():
                return i, int(idx[np.argmax(hit)])
        # Adjacent edge folding back along this one (a spike of zero width).
        j = (i + 1) % n
        a, b, c = starts[i], ends[i], ends[j]
        if abs(float(_cross(a, b, c))) <= _EPS and float(np.dot(b - a, c - b)) < 0:
            return i, j
    return None
