"""fl2va's picture blocks against transformers (fp32, CPU, tiny random Qwen3-VL, gate rel-L2 1e-5):
the numpy image preprocessing vs Qwen2VLImageProcessorPil (exact, with and without a resize), the vision
tower program vs Qwen3VLVisionModel (image embeddings and every deepstack feature, two pictures), and the
text stack with picture blocks (3-D mRoPE, pad rows replaced, deepstack added) vs Qwen3VLModel's
hidden_states[tap], at a tap past the deepstack layers and at tap 1 (before any addition)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dif.interp import interpret
from dif.text import TextTokenizer
from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.config import TAGS, H3TextConfig
from dif_frontend_h3.presentation import picture_presentation
from dif_frontend_h3.vision_config import H3VisionConfig, ImageProcessorConfig
from dif_frontend_h3.vision_preprocess import preprocess_images
from dif_frontend_h3.vision_text import build_vision_text_encoder, deepstack_used, picture_inputs
from dif_frontend_h3.vision_tower import build_vision_tower, vision_inputs

pytestmark = pytest.mark.oracle
PROCESSOR: dict[str, Any] = {
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5] * 3,
    "image_std": [0.5] * 3,
    "size": {"shortest_edge": 64, "longest_edge": 100_000},
}


def _pictures(h: int = 24, w: int = 40, n: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("size", [(24, 40), (96, 128), (30, 50)])
def test_preprocessing_matches_processor(size: tuple[int, int]) -> None:
    transformers = pytest.importorskip("transformers")
    pil = transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.Qwen2VLImageProcessorPil
    data = {**PROCESSOR, "size": {"shortest_edge": 2048, "longest_edge": 100_000}}  # 24x40 is upscaled, 30x50 too
    pics = _pictures(*size)
    want = pil(**data)(images=pics, return_tensors="np")
    got, grid = preprocess_images(pics, ImageProcessorConfig.from_dict(data))
    assert grid.tolist() == want["image_grid_thw"].tolist()
    assert np.array_equal(got, want["pixel_values"])


@pytest.fixture(scope="module")
def vl(tiny, randomize) -> tuple[Any, Any]:  # type: ignore[no-untyped-def]
    """A tiny Qwen3VLModel with two vision blocks (deepstack after both) and four text layers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_grad_enabled(False)
    vision = {**tiny.vision, "depth": 2, "deepstack_visual_indexes": [0, 1]}
    cfg = transformers.Qwen3VLConfig(text_config={**tiny.text, "num_hidden_layers": 4}, vision_config=vision)
    model = transformers.Qwen3VLModel(cfg).eval()
    randomize(model, torch, 5)
    return cfg, model


def _tower(cfg: Any, model: Any, pv: np.ndarray, grid: np.ndarray) -> tuple[H3VisionConfig, dict[str, np.ndarray]]:
    vcfg = H3VisionConfig.from_dict(cfg.to_dict())
    _, gh, gw = (int(g) for g in grid[0])
    prog = build_vision_tower(vcfg, images=len(grid), grid_h=gh, grid_w=gw)
    state = {f"visual.{k}": v.numpy() for k, v in model.visual.state_dict().items()}
    res = interpret(prog, vision_inputs(vcfg, pv, gh, gw, len(grid)), {p.name: state[p.name] for p in prog.params})
    return vcfg, dict(zip(prog.meta["outputs"].split(","), (res[o] for o in prog.outputs), strict=True))


def test_vision_tower_matches_transformers(vl, torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    cfg, model = vl
    pv, grid = preprocess_images(_pictures(), ImageProcessorConfig.from_dict(PROCESSOR))
    want = model.visual(torch.from_numpy(pv), grid_thw=torch.from_numpy(grid))
    _, got = _tower(cfg, model, pv, grid)
    errs = [rel_l2_fn(got["image_embeds"], want.pooler_output.numpy())]
    errs += [rel_l2_fn(got[f"deepstack_{j}"], f.numpy()) for j, f in enumerate(want.deepstack_features)]
    print("vision tower rel-L2 (embeds, deepstack...)", " ".join(f"{e:.2e}" for e in errs))
    assert len(errs) == 3 and max(errs) <= 1e-5


@pytest.mark.parametrize("tap", [3, 1])
def test_text_with_pictures_matches_transformers(vl, torch, rel_l2_fn, tap: int) -> None:  # type: ignore[no-untyped-def]
    cfg, model = vl
    pv, grid = preprocess_images(_pictures(), ImageProcessorConfig.from_dict(PROCESSOR))
    vcfg, tower = _tower(cfg, model, pv, grid)
    tok = TextTokenizer.from_folder(DEFAULT_CHECKPOINT / "tokenizer")
    ids, tags = picture_presentation(tok, vcfg, "a kite over the dunes", grid)
    assert tags.tolist().count(TAGS["video"]) == 2 * (1 + 15 + 1)  # two blocks of 3x5 merged rows
    t_ids = torch.tensor([ids])
    mm = (t_ids == vcfg.image_token_id).long()
    hs = model(input_ids=t_ids, attention_mask=torch.ones_like(t_ids), mm_token_type_ids=mm,
               pixel_values=torch.from_numpy(pv), image_grid_thw=torch.from_numpy(grid),
               output_hidden_states=True).hidden_states  # fmt: skip
    tcfg = H3TextConfig.from_dict(cfg.to_dict())
    vision_rows = len(tower["image_embeds"])
    prog = build_vision_text_encoder(tcfg, vcfg, seq_len=len(ids), vision_rows=vision_rows, tap=tap)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    inputs = {**picture_inputs(tcfg, vcfg, ids, grid), "image_embeds": tower["image_embeds"],
              **{f"deepstack_{j}": tower[f"deepstack_{j}"] for j in range(deepstack_used(vcfg, tap))}}  # fmt: skip
    got = interpret(prog, inputs, {p.name: state[p.name] for p in prog.params})[prog.outputs[0]]
    err = rel_l2_fn(got, hs[tap].numpy())
    print(f"text with pictures hidden_states[{tap}] rel-L2 {err:.2e}")
    assert err <= 1e-5
    assert rel_l2_fn(got, hs[tap + 1].numpy()) > 1e-2
