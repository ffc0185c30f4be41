"""Ulysses sequence parallelism (dif.parallel): the tiny FLUX.2 klein and MiniMax-H3 denoisers split for 2 and
4 ranks, the rank programs run on the CPU backend with the in-process all-to-all, their gathered outputs
equal to the single-device program's exactly in fp32 (odd lengths: padding on the last ranks; H3's packed
text | conditions | audio | video sequence with a keyframe block the program slices apart).

Exact equality needs a GEMM whose result for a row does not depend on how many rows it is given: a rank
multiplies S/P rows where one device multiplies S. numpy's BLAS sgemm is not (its kernels differ with M;
here up to ~1e-5 apart), so the exact tests run `linear` through numpy's einsum, whose per-element sum
order is fixed, for the single-device program and the ranks alike; the BLAS runs are checked to 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from attrs import evolve

from dif.ops.registry import OPS
from dif.parallel import Block, Sharding, ulysses
from dif.parallel.collectives import all_to_all, exchange_all_to_all, parallel_table
from dif.parallel.layout import single
from dif.parallel.local import gather, prepare_segment, run_ranks
from dif.parallel.segments import Collective, Segment, cut
from dif.parallel.ulysses import ParallelError
from dif.runtime import get_backend

flux2 = pytest.importorskip("dif_frontend_flux2", reason="the split is checked on the FLUX.2 klein denoiser")
from dif_frontend_flux2.config import Flux2TransformerConfig  # noqa: E402
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj  # noqa: E402

EMBEDDED = Path(flux2.__file__).parent / "default" / "transformer" / "config.json"
N_TXT, H, W = 7, 3, 5  # 7 text rows and 15 image rows: neither divides by 2 or 4


def tiny_klein(heads: int) -> Flux2TransformerConfig:
    """The embedded tiny klein transformer, with `heads` attention heads (4 ranks need 4)."""
    cfg = Flux2TransformerConfig.from_json(EMBEDDED)
    return evolve(cfg, num_attention_heads=heads)


def case(heads: int) -> tuple:  # type: ignore[type-arg]
    cfg = tiny_klein(heads)
    program = build_transformer(cfg, batch=1, n_img=H * W, n_txt=N_TXT)
    rng = np.random.default_rng(0)
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.2).astype(np.float32) for p in program.params}
    cos, sin = flux2_rope_tables(N_TXT, H, W, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    feeds = {
        "latents": rng.standard_normal((1, H * W, cfg.in_channels)).astype(np.float32),
        "text_features": rng.standard_normal((1, N_TXT, cfg.joint_attention_dim)).astype(np.float32),
        "timestep_proj": flux2_timestep_proj([500.0], channels=cfg.timestep_guidance_channels),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    return program, weights, feeds


def single_device(program, weights, feeds):  # type: ignore[no-untyped-def]
    exe, _ = prepare_segment(program, weights, get_backend("cpu"), [])
    return exe.run(feeds)[program.outputs[0]]


@pytest.fixture
def row_invariant_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """`linear` through einsum (fixed sum order per element) for everything prepared in the test."""
    op = OPS.get("linear")

    def linear(x, w, bias=None):  # type: ignore[no-untyped-def]
        y = np.einsum("...k,nk->...n", x.astype(np.float32), w.astype(np.float32))
        return y if bias is None else y + bias.astype(np.float32)

    monkeypatch.setitem(OPS._ops, "linear", evolve(op, reference=linear))


@pytest.mark.parametrize("ranks", [2, 4])
def test_split_equals_single_device_exactly(ranks: int, row_invariant_linear: None) -> None:
    program, weights, feeds = case(heads=4)
    want = single_device(program, weights, feeds)
    plan = ulysses(program, ranks, {"latents": 1, "text_features": 1})
    got, plans = run_ranks(plan, weights, feeds)
    out = got[program.outputs[0]]
    assert out.shape == want.shape == (1, H * W, 128)
    assert np.array_equal(out, want), np.abs(out - want).max()
    # the decisions head every segment's plan, as the passes' do
    texts = [f"{d.what}: {d.why}" for d in plans[ranks - 1][0].decisions]
    assert any(f"sequence parallel over {ranks} ranks" in t for t in texts)
    pad_img = -(-H * W // ranks) * ranks - H * W
    assert any("input latents split on axis 1" in t and f"{pad_img} padding" in t for t in texts)


def test_split_with_blas_is_close(ranks: int = 2) -> None:
    program, weights, feeds = case(heads=2)  # the embedded config itself
    want = single_device(program, weights, feeds)
    got, _ = run_ranks(ulysses(program, ranks, {"latents": 1, "text_features": 1}), weights, feeds)
    # the ranks' GEMMs see other row blocks than the whole one, and OpenBLAS picks its kernel by shape and CPU:
    # measured 1.5e-5 at most on an AMD EPYC host (OpenBLAS 0.3.31), under 1e-5 on others
    np.testing.assert_allclose(got[program.outputs[0]], want, rtol=0, atol=5e-5)


def test_rank_programs_exchange_around_every_attention() -> None:
    program, _, _ = case(heads=4)
    plan = ulysses(program, 2, {"latents": 1, "text_features": 1})
    assert len(plan.programs) == 2
    for p in plan.programs:
        hist = p.op_histogram()
        assert hist["all_to_all"] == 4 * program.op_histogram()["sdpa"]  # q, k, v before, the output after
        sdpa = [n for n in p.nodes if n.op == "sdpa"]
        assert all(p.types[n.operands[0]].shape == (1, N_TXT + H * W, 2, 32) for n in sdpa)  # every row, 2 heads
        assert all("ulysses" in p.provenance[n.id].transforms for n in sdpa)
        steps = cut(p)
        assert sum(isinstance(s, Collective) for s in steps) == hist["all_to_all"]
        assert all("all_to_all" not in s.program.op_histogram() for s in steps if isinstance(s, Segment))
    assert plan.output_shardings[program.outputs[0]] == single(1, H * W)


def test_refusals_name_the_node() -> None:
    program, _, _ = case(heads=2)
    with pytest.raises(ParallelError, match=r"sdpa.*2 heads, not divisible by 4"):
        ulysses(program, 4, {"latents": 1, "text_features": 1})
    with pytest.raises(ParallelError, match="not an input"):
        ulysses(program, 2, {"nope": 1})


def test_all_to_all_and_gather() -> None:
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 4, 2)).astype(np.float32) for _ in range(2)]
    ys = exchange_all_to_all(xs, split_axis=2, concat_axis=1)
    assert ys[0].shape == (1, 6, 2, 2)
    np.testing.assert_array_equal(ys[1][:, 3:], xs[1][:, :, 2:])  # rank 1's rows of heads 2..3
    back = exchange_all_to_all(ys, split_axis=1, concat_axis=2)
    for a, b in zip(back, xs, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(all_to_all(xs[0], ranks=1, split_axis=2, concat_axis=1), xs[0])
    assert "all_to_all" in parallel_table() and "all_to_all" not in OPS  # no backend is asked to lower it
    s = Sharding(0, (Block(0, 3), Block(3, 5)))  # chunks 2 and 3 per rank, padding 1 and 1
    full = np.arange(8.0)
    pieces = [np.array([0, 1, 3, 4, 5.0]), np.array([2, -1, 6, 7, -1.0])]
    np.testing.assert_array_equal(gather(pieces, s), full)


# -- MiniMax-H3: the packed video+audio sequence ------------------------------------------------------

TINY_H3 = dict(  # a tiny MiniMaxH3Transformer3DModel config (4 heads: 4 ranks)
    num_attention_heads=4, attention_head_dim=32, hidden_size=48, num_layers=2, num_refiner_layers=1, ffn_dim=64,
    in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2), text_dim=16, freq_dim=32, time_embed_hidden_dim=40,
    time_embed_dim=24, rope_freq_dim=4, rope_theta=10000.0,
)  # fmt: skip
H3_INPUTS = {"video_latents": 1, "audio_latents": 1, "text_embeds": 1}


def h3_case(anchors: tuple[str, ...]) -> tuple:  # type: ignore[type-arg]
    h3 = pytest.importorskip("dif_frontend_h3.model", reason="the H3 split needs dif-frontend-h3")
    from dif_frontend_h3.config import H3TransformerConfig
    from dif_frontend_h3.layout import build_layout

    cfg = H3TransformerConfig.from_dict(TINY_H3)
    layout = build_layout(np.ones(5, int), 2, 6, 6, 3, anchors=anchors)  # 5 text rows, 9 per frame, 6 audio
    program = h3.build_denoiser(cfg, layout)
    rng = np.random.default_rng(1)
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.2).astype(np.float32) for p in program.params}
    feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in program.inputs}
    cos, sin = h3.rope_tables(cfg, layout.position_ids)
    slots = np.linspace(0.3, 1.0, layout.num_slots)
    feeds |= {"rope_cos": cos, "rope_sin": sin, "time_proj": h3.time_proj(slots, cfg.freq_dim)}
    return program, weights, feeds, layout


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("anchors", [(), ("first",)], ids=["t2va", "keyframe"])
def test_h3_split_equals_single_device_exactly(
    ranks: int, anchors: tuple[str, ...], row_invariant_linear: None
) -> None:
    program, weights, feeds, layout = h3_case(anchors)
    exe, _ = prepare_segment(program, weights, get_backend("cpu"), [])
    want = exe.run(feeds)
    plan = ulysses(program, ranks, H3_INPUTS)
    assert plan.input_shardings["text_embeds"].padding(ranks) > 0  # 5 text rows: padding on the last ranks
    got, _ = run_ranks(plan, weights, feeds)
    for name in program.outputs:  # video and audio velocities
        assert got[name].shape == want[name].shape
        assert np.array_equal(got[name], want[name]), (name, np.abs(got[name] - want[name]).max())
    cut = [d.reason for d in plan.decisions if "cut at row" in d.reason]
    if anchors:  # the keyframe rows are modulated apart from the target rows: the video input is cut there
        c = layout.condition_rows
        assert cut == [f"input video_latents cut at row {c}: node 26 (slice) takes its rows apart there"]
        assert [b.length for b in plan.input_shardings["video_latents"].blocks] == [c, 18]
    else:
        assert not cut


def test_explicit_blocks_need_no_cut() -> None:
    program, _, _, layout = h3_case(("first",))
    c = layout.condition_rows
    video = Sharding(1, (Block(0, c), Block(c, 18)))
    plan = ulysses(program, 2, {**H3_INPUTS, "video_latents": video})
    assert not [d for d in plan.decisions if "cut at row" in d.reason]
    assert plan.input_shardings["video_latents"] == video


# -- Krea 2: grouped-query attention with a key mask (text padding) ----------------------------------

TINY_KREA2 = dict(  # a tiny Krea2Transformer2DModel config: 4 query heads over 2 key/value heads
    in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=96, timestep_embed_dim=32, text_hidden_dim=32, num_text_layers=3, text_num_attention_heads=2,
    text_num_key_value_heads=1, text_intermediate_size=48, num_layerwise_text_blocks=2, num_refiner_text_blocks=1,
    axes_dims_rope=(4, 6, 6), rope_theta=1000.0, norm_eps=1e-5,
)  # fmt: skip


@pytest.mark.usefixtures("row_invariant_linear")
def test_krea2_masked_gqa_split_equals_single_device_exactly() -> None:
    krea2 = pytest.importorskip("dif_frontend_krea2.model", reason="the masked split needs dif-frontend-krea2")
    from dif_frontend_krea2.config import Krea2TransformerConfig

    cfg = Krea2TransformerConfig.from_dict(TINY_KREA2)
    text_len, gh, gw = 9, 3, 5
    program = krea2.build_denoiser(cfg, image_len=gh * gw, text_len=text_len)
    rng = np.random.default_rng(2)
    weights = {p.name: (rng.standard_normal(p.type.shape) * 0.2).astype(np.float32) for p in program.params}
    cos, sin = krea2.rope_tables(cfg, text_len, gh, gw)
    text_mask = np.arange(text_len)[None, :] < 6  # 3 padded text keys, masked in every attention
    feeds = {
        "latents": rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32),
        "text_embeds": rng.standard_normal((1, text_len, cfg.hidden_size)).astype(np.float32),
        "timestep_proj": krea2.timestep_proj([0.7], dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
        "attention_mask": krea2.attention_mask(text_mask, gh * gw),
    }
    exe, _ = prepare_segment(program, weights, get_backend("cpu"), [])
    want = exe.run(feeds)[program.outputs[0]]
    got, _ = run_ranks(ulysses(program, 2, {"latents": 1, "text_embeds": 1}), weights, feeds)
    assert np.array_equal(got[program.outputs[0]], want)
    with pytest.raises(ParallelError, match="k has 2 heads, not divisible by 4"):
        ulysses(program, 4, {"latents": 1, "text_embeds": 1})
