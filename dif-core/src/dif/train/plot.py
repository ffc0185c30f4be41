"""A loss curve as a small PNG (no plotting library: a polyline rasterised with numpy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dif.media.png_writer import png_bytes
from dif.serialize.container import open_atomic

WIDTH, HEIGHT, MARGIN = 640, 320, 24


def loss_curve_pixels(losses: Sequence[float], *, smooth: int = 0) -> np.ndarray:
    """(HEIGHT, WIDTH, 3) uint8: white background, grey frame, the losses in blue (and, with `smooth`,
    their running mean over that many steps in red), y from min to max loss."""
    img = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    img[MARGIN, MARGIN:-MARGIN] = img[-MARGIN - 1, MARGIN:-MARGIN] = 160
    img[MARGIN:-MARGIN, MARGIN] = img[MARGIN:-MARGIN, -MARGIN - 1] = 160
    ys = np.asarray([x for x in losses if np.isfinite(x)], np.float64)
    if ys.size == 0:
        return img
    series = [(ys, (40, 90, 220))]
    if smooth > 1 and ys.size >= smooth:
        series.append((np.convolve(ys, np.ones(smooth) / smooth, mode="valid"), (220, 50, 40)))
    lo, hi = float(ys.min()), float(ys.max())
    span = hi - lo or 1.0
    for values, colour in series:
        n = values.size
        px = MARGIN + (np.arange(n) / max(1, n - 1)) * (WIDTH - 2 * MARGIN - 1)
        py = HEIGHT - MARGIN - 1 - (values - lo) / span * (HEIGHT - 2 * MARGIN - 1)
        for i in range(max(1, n - 1)):
            x0, y0 = px[i], py[i]
            x1, y1 = (px[i + 1], py[i + 1]) if n > 1 else (x0, y0)
            k = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
            xs = np.round(np.linspace(x0, x1, k)).astype(int)
            yy = np.round(np.linspace(y0, y1, k)).astype(int)
            img[yy, xs] = colour
    return img


def write_loss_curve(path: str | Path, losses: Sequence[float]) -> Path:
    path = Path(path)
    data = png_bytes(loss_curve_pixels(losses, smooth=min(10, max(1, len(losses) // 10))), [("Software", "dif train")])
    with open_atomic(path) as f:
        f.write(data)
    return path
