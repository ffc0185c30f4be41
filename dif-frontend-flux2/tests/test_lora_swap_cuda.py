"""LoRA hot swap on CUDA: the embedded FLUX.2 transformer built with side-GEMM slots is prepared ONCE
(one captured CUDA graph); LoRA A at 0.8, LoRA B at -0.5 and no LoRA are then only new input values,
and each run equals a fresh prepare of the merged weights and the CPU reference. The graph object is
the same before and after every swap (no re-capture). Skips with the reason where CUDA cannot run.
Not run in this session (no GPU here): the tolerances are the CUDA fp32 tests' usual 1e-4, to confirm."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.lora import LoraSpec, adapter_inputs, lora_slots, match_loras
from dif.runtime import prepare
from dif.serialize.diftensor import save_tensors
from dif.testing.backends import backend_skip_reason
from dif.weights import bind_weights, open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Flux2TransformerConfig
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj
from dif_frontend_flux2.weights import lora_table, merge_transformer_loras

pytestmark = pytest.mark.cuda
TOL = 1e-4
SLOT_RANK = 8


def make_lora(path: Path, seed: int, rank: int) -> Path:
    source = open_component(DEFAULT_CHECKPOINT / "transformer")
    rng = np.random.default_rng(seed)
    t = {}
    for name in source.names():
        if len(source.info(name).shape) == 2:
            out, inp = source.info(name).shape
            module = name[: -len(".weight")]
            t[f"transformer.{module}.lora_A.weight"] = (rng.standard_normal((rank, inp)) / inp**0.5).astype(np.float32)
            t[f"transformer.{module}.lora_B.weight"] = (0.3 * rng.standard_normal((out, rank))).astype(np.float32)
    save_tensors(path, t, dif_metadata=False)
    return path


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_swap_without_recapture(tmp_path: Path) -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")
    folder = DEFAULT_CHECKPOINT / "transformer"
    cfg = Flux2TransformerConfig.from_json(folder / "config.json")
    base = open_component(folder)
    table = lora_table(base)
    gh, gw, n_txt = 2, 2, 4
    rng = np.random.default_rng(0)
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32),
        "text_features": rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(np.float32),
        "timestep_proj": flux2_timestep_proj([0.7], channels=cfg.timestep_guidance_channels),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    slots = {t.param: SLOT_RANK for targets in table.values() for t in targets}
    with lora_slots(slots):
        prog = build_transformer(cfg, batch=1, n_img=gh * gw, n_txt=n_txt)
    exe, _ = prepare(prog, bind_weights(prog, base).materialize(), "cuda")
    graph = getattr(exe, "graph", None)
    lora_a, lora_b = make_lora(tmp_path / "a.safetensors", 1, 4), make_lora(tmp_path / "b.safetensors", 2, 8)
    for specs in ([LoraSpec(lora_a, 0.8)], [LoraSpec(lora_b, -0.5)], []):
        patches, _ = match_loras(base, specs, table, family="flux2", model="FLUX.2 [klein]") if specs else ({}, [])
        out = exe.run({**inputs, **adapter_inputs(prog, patches)})[prog.outputs[0]]
        assert getattr(exe, "graph", None) is graph, "the swap re-captured the graph"
        plain = build_transformer(cfg, batch=1, n_img=gh * gw, n_txt=n_txt)
        merged = bind_weights(plain, merge_transformer_loras(open_component(folder), specs)).materialize()
        fresh, _ = prepare(plain, merged, "cuda")
        assert rel(out, fresh.run(inputs)[plain.outputs[0]]) <= TOL
        assert rel(out, interpret(plain, inputs, merged)[plain.outputs[0]]) <= TOL
    assert graph is not None, "the prepared program captured no graph"
