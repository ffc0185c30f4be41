"""Tiled VAE decoding: a latent image decoded tile by tile, the tiles' overlaps blended linearly, so the
decoder's activations are bounded by one tile whatever the image size.

The layout is diffusers' (`AutoencoderKL*.tiled_decode`), so a tiled dif decode is the reference's tiled
decode: square tiles of `tile` latent pixels starting every `tile * (1 - overlap)` (the last ones on each
axis smaller, cut at the edge), each tile blended into the one above and the one to its left over
`blend` output pixels, then cropped to `keep` pixels and the rows concatenated. The blending mutates the
tiles in the reference's order (a tile is blended with its above neighbour after that one was itself
blended), which the loops here repeat. Arithmetic is float32 on the host; tiles are decoded by the
caller's `decode` (one program per distinct tile shape).

Where it sits: a frontend's pipeline decides when to tile (`dif-frontend-flux2`: `--vae-tiling`) and calls
`decode_tiled` with its decoder program's runner.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from attrs import frozen

OVERLAP = 0.25  # diffusers' tile_overlap_factor


@frozen
class TileLayout:
    """Tiles of `tile` latent pixels per side, decoded `scale` output pixels per latent pixel."""

    tile: int
    scale: int
    overlap: float = OVERLAP

    @property
    def step(self) -> int:
        """Latent pixels between tile starts."""
        return int(self.tile * (1 - self.overlap))

    @property
    def blend(self) -> int:
        """Output pixels over which a tile fades into its neighbour."""
        return int(self.tile * self.scale * self.overlap)

    @property
    def keep(self) -> int:
        """Output pixels of each tile that make it into the image (before the edge)."""
        return self.tile * self.scale - self.blend

    def starts(self, size: int) -> range:
        return range(0, size, self.step)

    def tiles(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """(top, left, tile height, tile width) in latent pixels, row by row."""
        return [
            (i, j, min(self.tile, height - i), min(self.tile, width - j))
            for i in self.starts(height)
            for j in self.starts(width)
        ]

    def shapes(self, height: int, width: int) -> list[tuple[int, int]]:
        """The distinct tile shapes of a height x width latent (each needs its own decoder program)."""
        return sorted({(th, tw) for _, _, th, tw in self.tiles(height, width)})

    def needed(self, height: int, width: int) -> bool:
        """Whether the latent is larger than one tile (else the whole decode is the only tile)."""
        return height > self.tile or width > self.tile


def _blend_rows(above: np.ndarray, tile: np.ndarray, extent: int) -> None:
    extent = min(above.shape[2], tile.shape[2], extent)
    for y in range(extent):
        tile[:, :, y, :] = above[:, :, -extent + y, :] * (1 - y / extent) + tile[:, :, y, :] * (y / extent)


def _blend_columns(left: np.ndarray, tile: np.ndarray, extent: int) -> None:
    extent = min(left.shape[3], tile.shape[3], extent)
    for x in range(extent):
        tile[:, :, :, x] = left[:, :, :, -extent + x] * (1 - x / extent) + tile[:, :, :, x] * (x / extent)


def decode_tiled(latent: np.ndarray, layout: TileLayout, decode: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The decoded image (B, C, H * scale, W * scale), float32, of `latent` (B, C', H, W) decoded tile by
    tile with `decode` (a (B, C', th, tw) latent tile -> its (B, C, th * scale, tw * scale) image)."""
    _, _, height, width = latent.shape
    tiles = {(i, j): latent[:, :, i : i + th, j : j + tw] for i, j, th, tw in layout.tiles(height, width)}
    decoded: dict[tuple[int, int], np.ndarray] = {}
    # tiles of one shape one after another: a caller holding one decoder program at a time prepares each once
    for at in sorted(tiles, key=lambda at: (tiles[at].shape, at)):
        decoded[at] = np.array(decode(np.ascontiguousarray(tiles[at])), dtype=np.float32)  # blended in place below
    rows = [[decoded[(i, j)] for j in layout.starts(width)] for i in layout.starts(height)]
    out_rows = []
    for i, row in enumerate(rows):
        parts = []
        for j, tile in enumerate(row):
            if i > 0:
                _blend_rows(rows[i - 1][j], tile, layout.blend)
            if j > 0:
                _blend_columns(row[j - 1], tile, layout.blend)
            parts.append(tile[:, :, : layout.keep, : layout.keep])
        out_rows.append(np.concatenate(parts, axis=3))
    return np.concatenate(out_rows, axis=2)
