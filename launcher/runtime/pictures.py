"""Pictures of probe images and Grad-CAM heatmaps, as PNG bytes, with numpy and the standard library.

Used inside images (`python -m launcher.runtime explain`) and on the host (the report), so it needs
neither matplotlib nor TensorFlow. The same arrays always give the same bytes (no dates, fixed zlib
level).

- :func:`image_rgb`: an input example (h x w x c, any value range) as 8-bit RGB, by a given range;
- :func:`heat_rgb`: a heatmap in [0, 1] in a perceptual blue-to-yellow map;
- :func:`overlay`: the heatmap, enlarged to the image's size, half over the image;
- :func:`difference_rgb`: a signed difference on a blue-white-red map, white at 0, ±``scale`` saturated;
- :func:`encode_png`: RGB uint8 -> PNG bytes.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

# Anchors of a blue -> teal -> green -> yellow map (close to viridis), from 0 to 1.
_HEAT = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
         (1.0, (253, 231, 37)))
_DIVERGING = ((-1.0, (33, 102, 172)), (0.0, (255, 255, 255)), (1.0, (178, 24, 43)))
MIN_SIDE = 128  # small images (48 x 48) are enlarged by a whole factor to at least this


def _ramp(values: Any, anchors: tuple[tuple[float, tuple[int, int, int]], ...]) -> Any:
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    xs = [a for a, _ in anchors]
    channels = [np.interp(v, xs, [c[i] for _, c in anchors]) for i in range(3)]
    return np.clip(np.rint(np.stack(channels, axis=-1)), 0, 255).astype(np.uint8)


def image_rgb(x: Any, lo: float, hi: float) -> Any:
    """An example (h x w, h x w x 1 or h x w x 3+) as RGB uint8, mapping [lo, hi] to [0, 255]."""
    import numpy as np

    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    a = a[:, :, :3]
    span = hi - lo if hi > lo else 1.0
    return np.clip(np.rint((a - lo) / span * 255.0), 0, 255).astype(np.uint8)


def resize(h: Any, height: int, width: int) -> Any:
    """Bilinear resize of a 2-D map (pixel centres aligned), as Grad-CAM maps are usually shown."""
    import numpy as np

    a = np.asarray(h, dtype=np.float64)
    if a.shape == (height, width):
        return a

    def axis(n_out: int, n_in: int) -> tuple[Any, Any, Any]:
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        i0 = np.floor(pos).astype(int)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, pos - i0

    r0, r1, fr = axis(height, a.shape[0])
    c0, c1, fc = axis(width, a.shape[1])
    top = a[r0][:, c0] * (1 - fc) + a[r0][:, c1] * fc
    bottom = a[r1][:, c0] * (1 - fc) + a[r1][:, c1] * fc
    return top * (1 - fr[:, None]) + bottom * fr[:, None]


def heat_rgb(h: Any) -> Any:
    import numpy as np

    return _ramp(np.clip(np.asarray(h, dtype=np.float64), 0.0, 1.0), _HEAT)


def overlay(image: Any, h: Any, alpha: float = 0.5) -> Any:
    """The heatmap, resized to the RGB image, blended over it."""
    import numpy as np

    img = np.asarray(image, dtype=np.float64)
    heat = heat_rgb(resize(h, img.shape[0], img.shape[1])).astype(np.float64)
    return np.clip(np.rint((1 - alpha) * img + alpha * heat), 0, 255).astype(np.uint8)


def difference_rgb(d: Any, scale: float, height: int, width: int) -> Any:
    """A signed difference map, resized, on blue (negative) - white (0) - red (positive), ±scale full."""
    import numpy as np

    s = scale if scale > 0 else 1.0
    return _ramp(np.clip(resize(d, height, width) / s, -1.0, 1.0), _DIVERGING)


def enlarge(rgb: Any, min_side: int = MIN_SIDE) -> Any:
    """Small pictures repeated pixel by pixel (a whole factor) to at least ``min_side``."""
    import numpy as np

    side = min(rgb.shape[0], rgb.shape[1])
    k = max(1, -(-min_side // max(side, 1)))
    return np.repeat(np.repeat(rgb, k, axis=0), k, axis=1) if k > 1 else rgb


def encode_png(rgb: Any) -> bytes:
    """RGB uint8 (h x w x 3) -> PNG bytes (8-bit truecolour, no ancillary chunks)."""
    import numpy as np

    a = np.ascontiguousarray(rgb, dtype=np.uint8)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"expected an h x w x 3 array, got shape {a.shape}")
    height, width = a.shape[:2]
    raw = b"".join(b"\x00" + a[row].tobytes() for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def decode_png(data: bytes) -> Any:
    """PNG bytes as :func:`encode_png` writes them (8-bit RGB, filter 0) -> h x w x 3 uint8."""
    import numpy as np

    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if (depth, colour) != (8, 2):
                raise ValueError("only 8-bit RGB PNGs are read here")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + 3 * width)
    if rows[:, 0].any():
        raise ValueError("only PNGs without row filters are read here")
    return rows[:, 1:].reshape(height, width, 3).copy()
