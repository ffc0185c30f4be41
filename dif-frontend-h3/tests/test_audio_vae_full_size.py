"""Full-size audio VAE: the decoder program built from the published config declares every decoder-side
tensor of AutoencoderKLMiniMaxH3Audio (built on torch's meta device), weight-norm pairs as one folded
weight of `weight_v`'s shape, nothing else; the encoder half is what the loader ignores."""

from __future__ import annotations

import json
import math
import re

import pytest

from dif_frontend_h3.audio_vae import build_audio_decoder
from dif_frontend_h3.configs import published
from dif_frontend_h3.vae_config import AudioVaeConfig
from dif_frontend_h3.vae_weights import AUDIO_ENCODER_PART

pytestmark = pytest.mark.oracle


def test_decoder_names_and_shapes_equal_diffusers(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    config = json.loads((published() / "audio_vae" / "config.json").read_text())
    cfg = AudioVaeConfig.from_dict(config)
    program = build_audio_decoder(cfg, num_latents=207)  # 124 frames at 24 fps: round(124 / 24 * 40)
    assert tuple(program.output_values[0].type.shape) == (2, 1, 207 * 800)
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLMiniMaxH3Audio.from_config(config)
    theirs = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    encoder = [n for n in theirs if any(re.fullmatch(p, n) for p in AUDIO_ENCODER_PART)]
    expected: dict[str, tuple[int, ...]] = {}
    for name, shape in theirs.items():
        if name in encoder:
            continue
        if name.endswith(".weight_g"):
            v = theirs[name[: -len("_g")] + "_v"]
            assert shape == (v[0],) + (1,) * (len(v) - 1), name
        elif name.endswith(".weight_v"):
            expected[name[: -len("_v")]] = shape
        else:
            expected[name] = shape
    ours = {p.name: tuple(p.type.shape) for p in program.params}
    assert ours == expected
    folded = sum(1 for n in theirs if n.endswith(".weight_v") and n not in encoder)
    assert folded == 1 + 7 + 7 * 3 * 3 * 2 + 1  # conv_pre, ups, AMP convs, conv_post
    # counted from the modules instead of the state dict: parameters less the norms g, plus the filters
    modules = (vae.decoder, vae.dec_in_proj)
    params = sum(p.numel() for m in modules for n, p in m.named_parameters() if not n.endswith("weight_g"))
    buffers = sum(b.numel() for m in modules for b in m.buffers())
    assert sum(math.prod(s) for s in ours.values()) == params + buffers


def test_published_and_bad_audio_vae_configs() -> None:
    from dif.errors import ConfigError

    cfg = AudioVaeConfig.from_json(published() / "audio_vae" / "config.json")
    assert (cfg.hop_length, cfg.sampling_rate, cfg.latent_channels) == (800, 32000, 32)
    with pytest.raises(ConfigError, match="encoder hop"):
        AudioVaeConfig.from_dict({"decoder_rates": [5, 5, 2, 2, 2, 2, 4]})
    with pytest.raises(ConfigError, match="at least its rate"):
        AudioVaeConfig.from_dict({"decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 1]})
    with pytest.raises(ConfigError, match="one list per resblock kernel"):
        AudioVaeConfig.from_dict({"resblock_dilation_sizes": [[1, 3, 5]]})
