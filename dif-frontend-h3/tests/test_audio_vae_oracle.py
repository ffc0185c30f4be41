"""Oracle parity: the MiniMax-H3 audio VAE decoder program vs diffusers' AutoencoderKLMiniMaxH3Audio
at a tiny random config, fp32 on CPU, through the modular pipeline's audio decode step (denormalize,
stereo as two batch items). The tiny config keeps every structural feature: rates 5 / 2 / 2 with
kernels 9 / 4 / 4 (odd and even phase counts), two AMP kernels with different dilations, weight-normed
convs written by `save_pretrained` (`weight_g` / `weight_v`) and folded by dif's loader, the
checkpoint's Kaiser-sinc filter buffers, clamping in effect. Also: the signal layers against torch,
and the loader's errors for half / mis-shaped weight-norm pairs."""

from __future__ import annotations

import numpy as np
import pytest

from dif.errors import DifError, WeightError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.layers.signal import conv1d, conv_transpose1d, replicate_pad1d, snake
from dif.weights import ArraySource, open_component
from dif.weights.weight_norm import WeightNormSource
from dif_frontend_h3.audio_vae import build_audio_decoder, decode_audio
from dif_frontend_h3.vae_config import AudioVaeConfig
from dif_frontend_h3.vae_weights import bind_audio_vae, load_audio_vae

pytestmark = pytest.mark.oracle

TINY = dict(
    encoder_dim=4,
    encoder_rates=(5, 2, 2),
    latent_dim=16,
    latent_channels=4,
    num_attention_heads=2,
    decoder_dim=16,
    decoder_rates=(5, 2, 2),
    decoder_kernel_sizes=(9, 4, 4),
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3), (1, 2)),
    latents_mean=[0.1, 0.2, -0.3, 0.0],
    latents_std=[1.0, 2.0, 0.5, 1.5],
)


@pytest.fixture(scope="module")
def tiny_audio_vae(torch, tmp_path_factory, randomize):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    folder = tmp_path_factory.mktemp("h3_audio_vae")
    vae = diffusers.AutoencoderKLMiniMaxH3Audio(**TINY).eval()
    randomize(vae, torch, 7)
    gen = torch.Generator().manual_seed(8)
    for name, t in vae.named_parameters():
        if name.endswith("weight_g"):  # row norms of order one keep the waveform mostly inside the clamp
            t.copy_(torch.rand(t.shape, generator=gen) * 0.6 + 0.4)
    vae.save_pretrained(folder)
    return vae, AudioVaeConfig.from_json(folder / "config.json"), folder


def test_decoder_matches_the_pipeline_decode(torch, tiny_audio_vae, rel_l2_fn):  # type: ignore[no-untyped-def]
    vae, cfg, folder = tiny_audio_vae
    latents = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1))
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1)
    expected = vae.decode(latents * std + mean, return_dict=False)[0].float().permute(1, 0, 2)[0].numpy()
    program = build_audio_decoder(cfg, num_latents=6, batch=2)
    weights = load_audio_vae(folder, program).materialize()
    got = decode_audio(cfg, latents.numpy(), lambda inputs: interpret(program, inputs, weights)[program.outputs[0]])
    assert got.shape == expected.shape == (2, 6 * cfg.hop_length)
    assert 0 < np.mean(np.abs(expected) == 1.0) < 0.5  # the clamp is exercised, not everything
    err = rel_l2_fn(got, expected)
    # measured: 4.3e-07 (5% of the samples clamped)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"


def test_signal_layers_match_torch(torch) -> None:  # type: ignore[no-untyped-def]
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    for cin, cout, k, stride, pad, length in [(4, 3, 9, 5, 2, 7), (3, 2, 4, 2, 1, 6), (1, 1, 12, 2, 15, 19)]:
        x = rng.standard_normal((2, cin, length)).astype(np.float32)
        w = rng.standard_normal((cin, cout, k)).astype(np.float32)
        bias = rng.standard_normal(cout).astype(np.float32)
        b = ProgramBuilder("t")
        y = conv_transpose1d(
            b, b.input("x", x.shape, "f32"), b.param("w", w.shape, "f32"), b.param("b", (cout,), "f32"),
            stride=stride, padding=pad,
        )  # fmt: skip
        b.output(y)
        got = interpret(b.build(), {"x": x}, {"w": w, "b": bias})[y.name]
        ref = F.conv_transpose1d(*(torch.from_numpy(a) for a in (x, w, bias)), stride=stride, padding=pad).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((2, 4, 10)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3)).astype(np.float32)
    alpha, beta = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    b = ProgramBuilder("t")
    y = conv1d(
        b, b.input("x", x.shape, "f32"), b.param("w", w.shape, "f32"), stride=2, padding=(3, 3), dilation=3, groups=2
    )
    y = snake(b, replicate_pad1d(b, y, 2, 3), b.param("a", (6,), "f32"), b.param("c", (6,), "f32"), log_scale=True)
    b.output(y)
    got = interpret(b.build(), {"x": x}, {"w": w, "a": alpha, "c": beta})[y.name]
    ref = F.conv1d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=3, dilation=3, groups=2)
    ref = F.pad(ref, (2, 3), mode="replicate")
    ea, eb = torch.exp(torch.from_numpy(alpha)).view(1, -1, 1), torch.exp(torch.from_numpy(beta)).view(1, -1, 1)
    ref = (ref + (eb + 1e-9).reciprocal() * torch.sin(ea * ref).pow(2)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_weight_norm_folding_equals_torch(torch) -> None:  # type: ignore[no-untyped-def]
    conv = torch.nn.utils.weight_norm(torch.nn.ConvTranspose1d(6, 3, 4))
    conv.weight_g.data.uniform_(0.5, 2.0)
    src = WeightNormSource(ArraySource({f"c.{k}": v.detach().numpy() for k, v in conv.state_dict().items()}))
    assert sorted(src.names()) == ["c.bias", "c.weight"] and src.info("c.weight").shape == (6, 3, 4)
    conv(torch.zeros(1, 6, 5))  # the forward pre-hook recomputes .weight
    np.testing.assert_allclose(src["c.weight"], conv.weight.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_loader_names_damaged_weight_norm_pairs(tiny_audio_vae) -> None:  # type: ignore[no-untyped-def]
    _, cfg, folder = tiny_audio_vae
    base = open_component(folder)
    arrays = {n: np.array(base[n]) for n in base.names()}
    program = build_audio_decoder(cfg, num_latents=3)
    half = {n: a for n, a in arrays.items() if n != "decoder.conv_pre.weight_g"}
    with pytest.raises(WeightError, match=r"'decoder\.conv_pre\.weight_v'.*has no 'decoder\.conv_pre\.weight_g'"):
        bind_audio_vae(program, ArraySource(half))
    bad = dict(arrays)
    bad["decoder.ups.0.0.weight_g"] = np.ones((3, 1, 1), np.float32)
    with pytest.raises(WeightError, match=r"decoder\.ups\.0\.0\.weight_g"):
        bind_audio_vae(program, ArraySource(bad))
    wrong = dict(arrays)
    wrong["decoder.ups.1.0.weight_v"] = np.ones((8, 4, 3), np.float32)
    wrong["decoder.ups.1.0.weight_g"] = np.ones((8, 1, 1), np.float32)
    with pytest.raises(WeightError, match=r"mis-shaped.*decoder\.ups\.1\.0\.weight.*folded from"):
        bind_audio_vae(program, ArraySource(wrong))
    missing = {n: a for n, a in arrays.items() if not n.startswith("decoder.activation_post.upsample")}
    with pytest.raises(WeightError, match=r"decoder\.activation_post\.upsample\.filter"):
        bind_audio_vae(program, ArraySource(missing))


def test_non_float32_decoder_is_refused(tiny_audio_vae) -> None:  # type: ignore[no-untyped-def]
    _, cfg, _ = tiny_audio_vae
    with pytest.raises(DifError, match="float32"):
        build_audio_decoder(cfg, num_latents=4, dtype="bf16")
