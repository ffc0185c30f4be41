"""LoRA hot swap on CUDA, Krea 2: the embedded transformer (whole forward: text fusion, embedders,
blocks) built with side-GEMM slots is prepared ONCE (one captured CUDA graph); LoRA A at 0.8, LoRA B
at -0.5 and no LoRA are then only new input values, and each run equals a fresh prepare of the
merged weights and the CPU reference; the graph object is the same before and after every swap.
Then the product path: `dif.load(..., backend="cuda", lora_swappable=True)` swaps with
`set_loras`, the denoiser is prepared once and keeps its graph, and each image equals a fresh
load of that set. Skips with the reason where CUDA cannot run. Not run in this session (no GPU
here): the tolerances are the CUDA fp32 tests' usual 1e-4, to confirm."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.lora import LoraSpec, adapter_inputs, lora_slots, match_loras, merge_loras
from dif.runtime import prepare
from dif.serialize.diftensor import save_tensors
from dif.testing.backends import backend_skip_reason
from dif.weights import ArraySource, bind_weights, open_component
from dif_frontend_krea2 import DEFAULT_CHECKPOINT
from dif_frontend_krea2.config import load_configs
from dif_frontend_krea2.lora import lora_table
from dif_frontend_krea2.model import build_transformer, rope_tables, timestep_proj_from_timesteps

pytestmark = pytest.mark.cuda
TOL = 1e-4
SLOT_RANK = 8
N_TXT, GH, GW = 5, 2, 3


def make_lora(path: Path, seed: int, rank: int, scale: float = 0.3) -> Path:
    source = open_component(DEFAULT_CHECKPOINT / "transformer")
    rng = np.random.default_rng(seed)
    t = {}
    for name in source.names():
        if name.endswith(".weight") and len(source.info(name).shape) == 2:
            out, inp = source.info(name).shape
            module = name[: -len(".weight")]
            t[f"transformer.{module}.lora_A.weight"] = (rng.standard_normal((rank, inp)) / inp**0.5).astype(np.float32)
            t[f"transformer.{module}.lora_B.weight"] = (scale * rng.standard_normal((out, rank))).astype(np.float32)
    save_tensors(path, t, dif_metadata=False)
    return path


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_swap_without_recapture(tmp_path: Path) -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")
    cfg = load_configs(DEFAULT_CHECKPOINT).transformer
    stored = open_component(DEFAULT_CHECKPOINT / "transformer")  # bf16: widened, so merging rounds nothing
    base = ArraySource({n: np.asarray(stored[n], np.float32) for n in stored.names()}, "embedded Krea 2 (f32)")
    table = lora_table(base)
    rng = np.random.default_rng(0)
    cos, sin = rope_tables(cfg, N_TXT, GH, GW)
    inputs = {
        "latents": rng.standard_normal((1, GH * GW, cfg.in_channels)).astype(np.float32),
        "text_hidden_states": rng.standard_normal((1, N_TXT, cfg.num_text_layers, cfg.text_hidden_dim)).astype(
            np.float32
        ),
        "timestep_proj": timestep_proj_from_timesteps(np.array([700.0], np.float32), dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
    }

    def build():  # type: ignore[no-untyped-def]
        return build_transformer(cfg, image_len=GH * GW, text_len=N_TXT, batch=1, masked=False)

    slots = {t.param: SLOT_RANK for targets in table.values() for t in targets}
    with lora_slots(slots):
        prog = build()
    exe, _ = prepare(prog, bind_weights(prog, base).materialize(), "cuda")
    graph = getattr(exe, "graph", None)
    assert graph is not None, "the prepared program captured no graph"
    lora_a, lora_b = make_lora(tmp_path / "a.safetensors", 1, 4), make_lora(tmp_path / "b.safetensors", 2, 8)
    plain = build()
    for specs in ([LoraSpec(lora_a, 0.8)], [LoraSpec(lora_b, -0.5)], []):
        patches, _ = match_loras(base, specs, table, family="krea2", model="Krea 2") if specs else ({}, [])
        out = exe.run({**inputs, **adapter_inputs(prog, patches)})[prog.outputs[0]]
        assert getattr(exe, "graph", None) is graph, "the swap re-captured the graph"
        merged = bind_weights(plain, merge_loras(base, specs, table, family="krea2", model="Krea 2")).materialize()
        fresh, _ = prepare(plain, merged, "cuda")
        assert rel(out, fresh.run(inputs)[plain.outputs[0]]) <= TOL
        assert rel(out, interpret(plain, inputs, merged)[plain.outputs[0]]) <= TOL


def test_pipeline_set_loras_keeps_the_graph(tmp_path: Path) -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")
    import dif

    settings = dict(width=32, height=32, seed=5, steps=2)
    a, b = make_lora(tmp_path / "a.safetensors", 1, 4, 0.05), make_lora(tmp_path / "b.safetensors", 2, 8, 0.05)
    pipe = dif.load(family="krea2", backend="cuda", dtype="f32", lora=[(a, 0.8)], lora_swappable=True)
    pipe("a fox", **settings)
    entries = {e.name: e for e in pipe.pipeline._programs._entries.values()}  # pipeline internals, for the graph
    denoiser = entries["krea2_denoiser"]
    graph = getattr(denoiser.executable, "graph", None)
    assert graph is not None and denoiser.prepared == 1
    for swap in ([(b, -0.5)], [], [(a, 0.3), (b, 0.6)]):
        pipe.set_loras(swap)
        got = pipe("a fox", **settings).run.pixels.astype(np.int16)
        assert denoiser.prepared == 1 and getattr(denoiser.executable, "graph", None) is graph, swap
        fresh = dif.load(family="krea2", backend="cuda", dtype="f32", lora=swap, lora_swappable=True)
        assert np.abs(got - fresh("a fox", **settings).run.pixels.astype(np.int16)).max() <= 1, swap
