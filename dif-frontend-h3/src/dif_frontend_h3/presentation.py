"""MiniMax-H3's fl2va presentation: the token ids of `"<Picture i>: "` + a vision block per keyframe, then
the prompt verbatim, with the per-row modality tags the DiT's layout takes.

Frontend stage 0 (tokenization), as the reference's `MiniMaxH3FL2VATextEncoderStep`: no chat template, no
special tokens; a vision block is `<|vision_start|>`, one `<|image_pad|>` per merged vision row (grid
t h w / merge^2), `<|vision_end|>`, all of its rows tagged video (what the DiT's AdaLN keys off); the
labels and the prompt are tagged text.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen

from dif.errors import UsageError
from dif.text import TextTokenizer
from dif_frontend_h3.config import TAGS
from dif_frontend_h3.text_encoder import prompt_ids
from dif_frontend_h3.vision_config import H3VisionConfig, ImageProcessorConfig
from dif_frontend_h3.vision_preprocess import preprocess_images


def picture_presentation(tokenizer: TextTokenizer, vcfg: H3VisionConfig, prompt: str,
                         grids: np.ndarray) -> tuple[list[int], np.ndarray]:  # fmt: skip
    """(token ids, tags (L,) int64) for one picture block per row of `grids` ((n, 3) t h w), then `prompt`."""
    ids: list[int] = []
    tags: list[int] = []
    for i, grid in enumerate(np.asarray(grids, dtype=np.int64)):
        label = tokenizer.encode(f"<Picture {i + 1}>: ")
        pads = int(np.prod(grid)) // vcfg.merge_unit
        block = [vcfg.vision_start_token_id, *[vcfg.image_token_id] * pads, vcfg.vision_end_token_id]
        ids += [*label, *block]
        tags += [TAGS["text"]] * len(label) + [TAGS["video"]] * len(block)
    text = prompt_ids(tokenizer, prompt)[0].tolist()
    return ids + text, np.asarray(tags + [TAGS["text"]] * len(text), dtype=np.int64)


@frozen(eq=False)
class PicturePrompt:
    """An fl2va presentation ready for the programs: token ids and tags, the keyframes' `pixel_values`
    (n P, patch_dim) and their one grid (t, h, w) in patches (every keyframe has the canvas's size)."""

    ids: list[int]
    tags: np.ndarray
    pixel_values: np.ndarray
    grids: np.ndarray

    @property
    def grid(self) -> tuple[int, int, int]:
        t, h, w = (int(g) for g in self.grids[0])
        return t, h, w

    @property
    def images(self) -> int:
        return len(self.grids)


def fl2va_presentation(tokenizer: TextTokenizer, vcfg: H3VisionConfig, pcfg: ImageProcessorConfig, prompt: str,
                       keyframes: list[np.ndarray]) -> PicturePrompt:  # fmt: skip
    """The keyframes (H, W, 3) uint8 through the image processor and their picture blocks before `prompt`."""
    pixel_values, grids = preprocess_images(keyframes, pcfg)
    if len({tuple(g) for g in grids.tolist()}) != 1:
        raise UsageError(f"the keyframes' patch grids differ ({grids.tolist()}): give keyframes of one size")
    ids, tags = picture_presentation(tokenizer, vcfg, prompt, grids)
    return PicturePrompt(ids, tags, pixel_values, grids)
