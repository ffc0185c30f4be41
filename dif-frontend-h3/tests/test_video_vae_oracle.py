"""Oracle parity: the MiniMax-H3 video VAE programs vs diffusers' AutoencoderKLMiniMaxH3 at a tiny
random config, fp32 on CPU: one chunk through the ViT decoder; the whole decode (denormalize, >= 2
temporal chunks cross-faded, 3 x 4 spatial tiles blended, ImageNet convention reverted) against the
modular pipeline's decode step; the CNN encoder for one frame and for clips; the fl2va keyframe latent
against `encode_vae_condition`. Weights are written by `save_pretrained` and read back by dif's loader.

The tiny config keeps the real temporal geometry (4x, 17-frame clips, 3 tokens dropped: chunks of 5 + 2
latent frames, 3 pre-padding frames, a 5-frame cross-fade) with a 4x spatial ratio; tiles are 16 px
with 8 px minimum overlap (the reference's `enable_tiling`), so a 28 x 36 px canvas is 3 x 4 tiles
whose overlaps are widened unevenly (12 / 8 px), as 768 x 1344 is at 256 / 64 px.
"""

from __future__ import annotations

import pytest

from dif.interp import interpret
from dif_frontend_h3.vae_config import PIXEL_MEAN, PIXEL_STD, VideoVaeConfig
from dif_frontend_h3.vae_weights import load_video_vae
from dif_frontend_h3.video_vae import build_video_decoder, video_decoder_inputs
from dif_frontend_h3.video_vae_encoder import build_video_encoder
from dif_frontend_h3.video_vae_tiling import (
    VideoTiling,
    decode_tile_count,
    decode_video,
    encode_moments,
    normalize_pixels,
    sample_keyframe_latents,
)

pytestmark = pytest.mark.oracle

TINY = dict(
    block_out_channels=(8, 16, 16),
    layers_per_block=1,
    spatial_downsample_factors=(2, 2, 1),
    temporal_downsample_factors=(2, 2, 1),
    norm_num_groups=4,
    decoder_num_layers=2,
    decoder_num_attention_heads=2,
    decoder_attention_head_dim=16,  # 12 of 16 channels rotated (ratio 0.75), as 48 of 64
    decoder_num_register_tokens=2,
    latent_channels=4,
    latents_mean=(0.1, -0.2, 0.3, 0.05),
    latents_std=(1.5, 0.5, 2.0, 0.8),
)
TILING = VideoTiling(16, 16, 8, 8)


@pytest.fixture(scope="module")
def tiny_vae(torch, tmp_path_factory, randomize):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    folder = tmp_path_factory.mktemp("h3_vae")
    vae = diffusers.AutoencoderKLMiniMaxH3(**TINY).eval()
    randomize(vae, torch, 5)
    vae.save_pretrained(folder)
    return vae, VideoVaeConfig.from_json(folder / "config.json"), folder


class Runner:
    """Decoder / encoder programs by input shape, run by the reference interpreter."""

    def __init__(self, build, folder, key):  # type: ignore[no-untyped-def]
        self.build, self.folder, self.key, self.programs, self.calls = build, folder, key, {}, 0

    def __call__(self, inputs):  # type: ignore[no-untyped-def]
        arr = inputs[self.key] if isinstance(inputs, dict) else inputs
        feed = inputs if isinstance(inputs, dict) else {self.key: inputs}
        if arr.shape not in self.programs:
            program = self.build(arr.shape)
            self.programs[arr.shape] = (program, load_video_vae(self.folder, program).materialize())
        program, weights = self.programs[arr.shape]
        self.calls += 1
        return interpret(program, feed, weights)[program.outputs[0]]


def _decoder_runner(cfg, folder):  # type: ignore[no-untyped-def]
    return Runner(lambda s: build_video_decoder(cfg, frames=s[2], height=s[3], width=s[4]), folder, "latent")


def _encoder_runner(cfg, folder):  # type: ignore[no-untyped-def]
    return Runner(lambda s: build_video_encoder(cfg, frames=s[2], height=s[3], width=s[4]), folder, "pixels")


def _reference_decode(torch, vae, latents):  # type: ignore[no-untyped-def]
    """The modular pipeline's MiniMaxH3VideoDecodeStep arithmetic (decoders.py), tiled VAE decode."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    video = vae.decode(latents * std + mean, return_dict=False)[0]
    pm, ps = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1), torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
    return (video.float() * ps + pm).clamp(0, 1).numpy()


def test_one_chunk_decoder_matches_diffusers(torch, tiny_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    vae, cfg, folder = tiny_vae
    z = torch.randn(1, 4, 7, 3, 5, generator=torch.Generator().manual_seed(1))
    expected = vae.decoder(vae.post_quant_conv(z)).numpy()
    program = build_video_decoder(cfg, frames=7, height=3, width=5)
    got = interpret(program, video_decoder_inputs(cfg, z.numpy()), load_video_vae(folder, program))[program.outputs[0]]
    assert got.shape == (1, 3, 28, 12, 20)
    err = rel_l2_fn(got, expected)
    # measured: 1.4e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


def test_chunked_tiled_decode_matches_the_pipeline(torch, tiny_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    vae, cfg, folder = tiny_vae
    vae.enable_tiling(TILING.tile_height, TILING.tile_width, TILING.min_overlap_height, TILING.min_overlap_width)
    latents = torch.randn(1, 4, 12, 7, 9, generator=torch.Generator().manual_seed(2))  # 5n + 2, n = 2
    expected = _reference_decode(torch, vae, latents)
    run = _decoder_runner(cfg, folder)
    seen = []
    got = decode_video(cfg, latents.numpy(), run, tiling=TILING, progress=lambda d, t: seen.append((d, t)))
    assert got.shape == expected.shape == (1, 3, 39, 28, 36)  # 17n + 5 frames
    assert run.calls == decode_tile_count(cfg, latents.shape, TILING) == 2 * 3 * 4
    assert list(run.programs) == [(1, 4, 7, 4, 4)]  # one tile shape for the whole video
    assert seen[-1] == (24, 24)
    err = rel_l2_fn(got, expected)
    # measured: 6.9e-08
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


@pytest.mark.parametrize("frames", [9, 13])
def test_decode_of_lengths_that_need_repeated_frames(torch, tiny_vae, rel_l2_fn, frames):  # type: ignore[no-untyped-def]
    """T not of the form 5n + 2: the last latent frame is repeated and the extra pixel frames cut."""
    vae, cfg, folder = tiny_vae
    vae.enable_tiling(TILING.tile_height, TILING.tile_width, TILING.min_overlap_height, TILING.min_overlap_width)
    latents = torch.randn(1, 4, frames, 4, 4, generator=torch.Generator().manual_seed(frames))
    expected = _reference_decode(torch, vae, latents)
    got = decode_video(cfg, latents.numpy(), _decoder_runner(cfg, folder), tiling=TILING)
    assert got.shape == expected.shape
    err = rel_l2_fn(got, expected)
    # measured: 8.0e-08 (9), 8.0e-08 (13)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


@pytest.mark.parametrize("frames", [1, 17])
def test_encoder_matches_diffusers(torch, tiny_vae, rel_l2_fn, frames):  # type: ignore[no-untyped-def]
    vae, cfg, folder = tiny_vae
    x = torch.randn(1, 3, frames, 12, 20, generator=torch.Generator().manual_seed(3))
    expected = vae.quant_conv(vae.encoder(x)).numpy()
    program = build_video_encoder(cfg, frames=frames, height=12, width=20)
    got = interpret(program, {"pixels": x.numpy()}, load_video_vae(folder, program))[program.outputs[0]]
    assert got.shape == expected.shape == (1, 8, 1 if frames == 1 else 5, 3, 5)
    err = rel_l2_fn(got, expected)
    # measured: 5.0e-07 (1 frame), 5.1e-07 (17)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


def test_keyframe_latent_matches_encode_vae_condition(torch, tiny_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    """uint8 keyframe -> tiled encode (3 x 4 tiles) -> sampled under seed 42 -> fp16 -> normalized."""
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    vae, cfg, folder = tiny_vae
    vae.enable_tiling(TILING.tile_height, TILING.tile_width, TILING.min_overlap_height, TILING.min_overlap_width)
    pixels = torch.randint(0, 256, (1, 3, 1, 28, 36), generator=torch.Generator().manual_seed(4), dtype=torch.uint8)
    expected = encode_vae_condition(vae, pixels, PIXEL_MEAN, PIXEL_STD).numpy()
    run = _encoder_runner(cfg, folder)
    moments = encode_moments(cfg, normalize_pixels(pixels.numpy()), run, TILING)
    assert run.calls == 12
    got = sample_keyframe_latents(cfg, moments)
    assert got.shape == expected.shape == (1, 4, 1, 7, 9)
    err = rel_l2_fn(got, expected)
    # measured: 0 (the fp16 rounding absorbs the last-bit differences of the moments)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


def test_bf16_decoder_follows_the_reference_precision(torch, tiny_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    """bf16 linears / attention, fp32 norms and layer scales (`_keep_in_fp32_modules`), vs diffusers
    loaded with torch_dtype=bfloat16: as close to it as bf16 rounding allows."""
    import diffusers

    vae, cfg, folder = tiny_vae
    bf16 = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
    z = torch.randn(1, 4, 7, 3, 5, generator=torch.Generator().manual_seed(1))
    expected = bf16.decoder(bf16.post_quant_conv(z.to(torch.bfloat16))).float().numpy()
    program = build_video_decoder(cfg, frames=7, height=3, width=5, dtype="bf16")
    assert {p.type.dtype.value for p in program.params if "scale" in p.name or "norm" in p.name} == {"f32"}
    got = interpret(program, video_decoder_inputs(cfg, z.numpy()), load_video_vae(folder, program))[program.outputs[0]]
    err = rel_l2_fn(got, expected)
    # measured: 3.6e-03 (diffusers bf16 vs its own fp32: 4.1e-03)
    assert err <= 1e-2, f"rel-L2 {err:.3e}"


def test_loader_names_missing_and_misshaped_tensors(tiny_vae, tmp_path):  # type: ignore[no-untyped-def]
    from safetensors.numpy import load_file, save_file

    from dif.errors import CheckpointError, WeightError

    _, cfg, folder = tiny_vae
    program = build_video_decoder(cfg, frames=7, height=3, width=5)
    with pytest.raises(CheckpointError, match="video VAE folder does not exist"):
        load_video_vae(tmp_path / "nope", program)
    tensors = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    del tensors["decoder.transformer_blocks.1.scale2"]
    tensors["decoder.proj_in.weight"] = tensors["decoder.proj_in.weight"][:, :3].copy()
    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(WeightError) as err:
        load_video_vae(tmp_path, program)
    text = str(err.value)
    assert "decoder.transformer_blocks.1.scale2" in text and "missing" in text
    assert "decoder.proj_in.weight" in text and "mis-shaped" in text
    # the encoder program does not care about the decoder half
    encoder = build_video_encoder(cfg, height=16, width=16)
    assert len(load_video_vae(tmp_path, encoder)) == len(encoder.params)


def test_multi_clip_encode_matches_diffusers(torch, tiny_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    """25 frames: padded to two 17-frame clips, each tiled (2 x 2 tiles), 3 trailing latent frames dropped."""
    from dif_frontend_h3.video_vae_tiling import encode_video_moments

    vae, cfg, folder = tiny_vae
    vae.enable_tiling(TILING.tile_height, TILING.tile_width, TILING.min_overlap_height, TILING.min_overlap_width)
    x = torch.randn(1, 3, 25, 24, 20, generator=torch.Generator().manual_seed(6))
    expected = vae.encode(x).latent_dist.parameters.numpy()
    run = _encoder_runner(cfg, folder)
    got = encode_video_moments(cfg, x.numpy(), run, TILING)
    assert got.shape == expected.shape == (1, 8, 2 * 5 - 3, 6, 5)
    assert run.calls == 2 * 2 * 2
    err = rel_l2_fn(got, expected)
    # measured: 4.7e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e}"
