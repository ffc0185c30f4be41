"""fl2va's text features, whole path: dif's `H3Pipeline` (presentation with two picture blocks, the numpy
image processor, the vision tower and text stack programs, the layout's tags) against diffusers' modular
`MiniMaxH3FL2VATextEncoderStep` (fp32, CPU). The folder is the embedded checkpoint with its text encoder
replaced by a tiny random Qwen3VLForConditionalGeneration written by save_pretrained (two vision blocks,
deepstack after both, the published processor settings: the 128x96 keyframes are upscaled to 320x224).
Gate rel-L2 1e-5 on the prompt embeds; tags and the layout's text rows exact."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.configs import published
from dif_frontend_h3.pipeline import H3Pipeline, Keyframe, VideoRequest
from dif_frontend_h3.weights import open_checkpoint

pytestmark = pytest.mark.oracle
PUBLISHED_PROCESSOR: dict[str, Any] = json.loads((published() / "processor" / "preprocessor_config.json").read_text())
TINY_VISION: dict[str, Any] = dict(
    depth=2,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=8,
    deepstack_visual_indexes=[0, 1],
    patch_size=16,
    num_position_embeddings=16,
)


def _picture(seed: int, h: int = 96, w: int = 128) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, randomize) -> tuple[Path, Any]:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_grad_enabled(False)
    root = tmp_path_factory.mktemp("h3") / "h3"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    shutil.rmtree(root / "text_encoder")
    text = json.loads((DEFAULT_CHECKPOINT / "text_encoder" / "config.json").read_text())["text_config"]
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=TINY_VISION)
    model = transformers.Qwen3VLForConditionalGeneration(cfg).eval().float()
    randomize(model, torch, 11)
    model.save_pretrained(root / "text_encoder")
    (root / "processor").mkdir(exist_ok=True)  # the embedded default has one: the published settings again
    (root / "processor" / "preprocessor_config.json").write_text(json.dumps(PUBLISHED_PROCESSOR))
    return root, model


class _Processor:
    """The two things the reference step asks of its Qwen3VLProcessor (whose video half needs torchvision):
    the image processor, and the token types (image pad tokens 1, the rest 0)."""

    def __init__(self, image_token_id: int) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.image_processor = Qwen2VLImageProcessorPil(**PUBLISHED_PROCESSOR)
        self.image_token_id = image_token_id

    def create_mm_token_type_ids(self, input_ids: list[list[int]]) -> list[list[int]]:
        return [[int(t == self.image_token_id) for t in ids] for ids in input_ids]


def test_fl2va_text_matches_reference(folder, torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    from diffusers.modular_pipelines import PipelineState
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3FL2VATextEncoderStep
    from PIL import Image

    root, model = folder
    prompt = "the kite lifts off the dunes"
    pics = [_picture(1), _picture(2)]
    components = SimpleNamespace(
        text_encoder=model, tokenizer=transformers.AutoTokenizer.from_pretrained(root / "tokenizer"),
        processor=_Processor(model.config.image_token_id), text_encoder_layer=3, text_tag=1, video_tag=0,
        _execution_device=torch.device("cpu"),
    )  # fmt: skip
    state = PipelineState()
    state.set("prompt", prompt)
    state.set("keyframes", [Image.fromarray(p) for p in pics])
    _, state = MiniMaxH3FL2VATextEncoderStep()(components, state)
    want, want_tags = state.get("prompt_embeds").numpy(), state.get("text_token_tags").numpy()

    pipe = H3Pipeline(open_checkpoint(root), backend="interp")
    req = VideoRequest(prompt, 22, 128, 96, 3, keyframes=(Keyframe("first", pics[0]), Keyframe("last", pics[1])))
    layout = pipe.check(req, decode=False)
    pictures = pipe.pictures(req)
    assert pictures is not None
    got = pipe.encode_pictures(pictures)
    assert pictures.tags.tolist() == want_tags.tolist()
    assert layout.tags[: layout.text_len].tolist() == want_tags.tolist()
    assert want_tags.tolist().count(0) == 2 * (1 + 70 + 1)  # 320x224 -> 20x14 patches -> 70 merged rows each
    err = rel_l2_fn(got, want)
    print(f"fl2va text features rel-L2 {err:.2e} ({len(want_tags)} rows)")
    assert err <= 1e-5
