"""A cost-quality plot as a PNG, drawn with numpy and written with zlib (no plotting library).

The picture is deliberately plain: a white square, the unit box, the diagonal (the random
router) in light grey, a grid at every 0.1, and one coloured polyline per router of PGR(c)
against cost c, with PGR clipped to [-0.1, 1.1]. There is no text; the colours are listed by
``tiergate eval`` next to the numbers. Matplotlib would add ~40 MB of wheels to the image for
one figure nobody reads on the request path, so it is not a dependency.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from router.training.apgr import Curve

__all__ = ["COLOURS", "write_curve_png"]

COLOURS: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("blue", (31, 119, 180)),
    ("orange", (255, 127, 14)),
    ("green", (44, 160, 44)),
    ("red", (214, 39, 40)),
    ("purple", (148, 103, 189)),
)
_SIZE = 480
_MARGIN = 40
_Y_LOW, _Y_HIGH = -0.1, 1.1


def _to_pixels(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    span = _SIZE - 2 * _MARGIN
    y = np.clip(y, _Y_LOW, _Y_HIGH)
    col = _MARGIN + x * span
    row = _SIZE - _MARGIN - (y - _Y_LOW) / (_Y_HIGH - _Y_LOW) * span
    return row, col


def _line(image: np.ndarray, points: tuple[np.ndarray, np.ndarray], colour: Sequence[int]) -> None:
    rows, cols = points
    for r0, c0, r1, c1 in zip(rows[:-1], cols[:-1], rows[1:], cols[1:], strict=True):
        steps = int(max(abs(r1 - r0), abs(c1 - c0))) + 1
        rr = np.rint(np.linspace(r0, r1, steps + 1)).astype(int)
        cc = np.rint(np.linspace(c0, c1, steps + 1)).astype(int)
        for dr in (0, 1):
            for dc in (0, 1):
                image[np.clip(rr + dr, 0, _SIZE - 1), np.clip(cc + dc, 0, _SIZE - 1)] = colour


def _decimate(curve: Curve, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    index = np.unique(np.linspace(0, len(curve.cost) - 1, points).astype(int))
    return curve.cost[index], curve.pgr[index]


def _png(image: np.ndarray) -> bytes:
    height, width, _ = image.shape
    raw = b"".join(b"\x00" + image[r].astype(np.uint8).tobytes() for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def write_curve_png(curves: Mapping[str, Curve], path: Path) -> dict[str, str]:
    """Draw PGR(c) of each curve (in order, one colour each); returns router → colour name."""
    image = np.full((_SIZE, _SIZE, 3), 255, dtype=np.uint8)
    grid = np.linspace(0.0, 1.0, 11)
    for value in grid:
        _line(image, _to_pixels(np.array([value, value]), np.array([_Y_LOW, _Y_HIGH])), (235,) * 3)
        _line(image, _to_pixels(np.array([0.0, 1.0]), np.array([value, value])), (235,) * 3)
    _line(image, _to_pixels(np.array([0.0, 1.0]), np.array([0.0, 1.0])), (180,) * 3)
    box_x, box_y = np.array([0.0, 1.0, 1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0, 1.0, 0.0])
    _line(image, _to_pixels(box_x, box_y), (0, 0, 0))
    legend: dict[str, str] = {}
    for (name, curve), (colour_name, colour) in zip(curves.items(), COLOURS, strict=False):
        if np.isnan(curve.pgr).any():
            continue
        _line(image, _to_pixels(*_decimate(curve)), colour)
        legend[name] = colour_name
    path.write_bytes(_png(image))
    return legend
