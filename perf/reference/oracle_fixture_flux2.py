"""Development script: an oracle fixture (manifest protocol `dif-oracle-fixture/1`) of the FLUX.2 [klein]
transformer from diffusers, for `dif bisect manifest` / `dif bisect validate-oracle`.

    python perf/reference/oracle_fixture_flux2.py --out /tmp/fx/klein.json [--checkpoint DIR] [--grid 2 --text 8]

Loads the transformer of a diffusers folder (default: the embedded tiny demo checkpoint) into diffusers'
Flux2Transformer2DModel (fp32, CPU), runs one forward on seeded inputs with forward hooks on every double
and single block, and writes beside the manifest: the oracle tensors, the dif program of the same forward
(`<stem>.difir`, as built) and its inputs (`<stem>.inputs.safetensors`). The model-specific part lives
here and only here: which diffusers output answers to which dif boundary. dif's block boundaries are
the last result of each provenance block (what DIF_CAPTURE=blocks captures): a double block ends with
its text stream (diffusers' output[0]), a single block with the joint sequence, the program with the
velocity. Then:

    dif bisect validate-oracle /tmp/fx/klein.json
    DIF_CAPTURE=blocks DIF_CAPTURE_DIR=/tmp/fx/cap DIF_PASSES=none dif run /tmp/fx/klein.difir \
        --inputs /tmp/fx/klein.inputs.safetensors --weights W --out /tmp/fx/out.safetensors
    dif bisect manifest /tmp/fx/klein.json --capture /tmp/fx/cap/flux2_transformer.0.diftensor
(W: the checkpoint's transformer weights, `diffusion_pytorch_model.safetensors`.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> Path:
    import diffusers
    import torch
    from diffusers import Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    from dif.bisect.fixtures import write_manifest
    from dif.serialize.difir import save_program
    from dif.serialize.diftensor import save_tensors
    from dif.trace.recorder import block_ends
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the manifest to write (JSON)")
    ap.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT, help="a diffusers FLUX.2 folder")
    ap.add_argument("--grid", type=int, default=2, help="latent grid side (image tokens = grid^2)")
    ap.add_argument("--text", type=int, default=8, help="text tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)

    folder = args.checkpoint / "transformer"
    model = Flux2Transformer2DModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    cfg = Flux2TransformerConfig.from_json(folder / "config.json")
    g, n_txt = args.grid, args.text
    rng = np.random.default_rng(args.seed)
    latents = rng.standard_normal((1, g * g, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t = torch.tensor([0.7])

    captured: dict[str, np.ndarray] = {}

    def hook(name: str, index: int | None) -> Any:
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            value = output[index] if index is not None else output
            captured[name] = value.detach().float().numpy().copy()

        return record

    for i, block in enumerate(model.transformer_blocks):
        block.register_forward_hook(hook(f"transformer_blocks.{i}", 0))  # (encoder_hidden_states, hidden_states)
    for i, block in enumerate(model.single_transformer_blocks):
        block.register_forward_hook(hook(f"single_transformer_blocks.{i}", None))
    out = model(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(text),
        timestep=t,
        img_ids=Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, 1, g, g)),
        txt_ids=Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, n_txt, 1)),
        return_dict=False,
    )[0]
    captured["velocity"] = out.float().numpy().copy()

    program = build_transformer(cfg, batch=1, n_img=g * g, n_txt=n_txt)
    ends = {}
    for node_id in sorted(block_ends(program, [n.id for n in program.nodes])):
        prov = program.provenance.get(node_id)
        if prov is not None and prov.block:
            ends[prov.block] = program.node_by_id[node_id].results[-1].name
    cos, sin = flux2_rope_tables(n_txt, g, g, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": model.time_guidance_embed.time_proj(t * 1000).numpy(),  # the oracle's own sinusoid
        "rope_cos": cos,
        "rope_sin": sin,
    }
    boundaries = [{"name": n, "tensor": n, "dif": ends.get(n)} for n in captured if n != "velocity"]
    boundaries.append({"name": "velocity", "tensor": "velocity", "dif": program.outputs[0]})
    producer = {
        "library": "diffusers",
        "version": diffusers.__version__,
        "torch": torch.__version__,
        "model": "Flux2Transformer2DModel",
        "checkpoint": str(args.checkpoint),
        "script": "perf/reference/oracle_fixture_flux2.py",
        "seed": args.seed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    manifest = write_manifest(args.out, captured, boundaries, producer)
    save_program(program, args.out.with_suffix(".difir"))
    save_tensors(args.out.with_name(args.out.stem + ".inputs.safetensors"), inputs)
    print(manifest)
    return manifest


if __name__ == "__main__":
    main()
