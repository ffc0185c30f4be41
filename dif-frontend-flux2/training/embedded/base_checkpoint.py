"""The random starting point of the embedded demo model: `make_default_checkpoint.py`'s tiny klein with
the two changes training needs, then the text encoder's branches quietened (`text_encoder.py`).

Training recipe stage 0 (outside the package). The transformer is widened to 128 (4 heads of 32): at
width 64 the stream is narrower than the 128 packed latent channels, so the velocity it predicts has rank
64 per token and the noise in the other directions survives a 4-step sample (measured: blobs at every
prompt). The default size becomes 256 (the VAE config's `sample_size`), the size the model is trained at.
model_index.json carries `max_sequence_length` TEXT_ROWS (32; the pipeline's default is 512): every caption
of the data and the judge is 18-22 tokens with the chat template, and with 512 rows ~490 identical pad rows
would form an attention sink the few content tokens must outweigh.

    python base_checkpoint.py OUT_DIR [--vae-channels 16,32,32,32] [--vae-groups 4] [--heads 4]
        [--double-blocks 1] [--single-blocks 1]

`--vae-channels` / `--vae-groups` set the VAE's block widths and GroupNorm groups (default: the script's
8,8,8,8 and 4). At 8 channels in groups of 2, a GroupNorm over a flat background leaves the decoder little
to tell the colours apart by; a wider VAE still decodes 256² on a CPU in about a second.
`--heads` (of 32 channels each), `--double-blocks` and `--single-blocks` size the transformer (default 4, 1
and 1: width 128, 0.9 M parameters, 3.9 MB in float32; the installed default is `--heads 5 --double-blocks 2
--single-blocks 2`, 2.5 M parameters, 10 MB; the package holds 30 MB in all).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parents[1] / "scripts" / "make_default_checkpoint.py"
TOKENIZER = HERE.parents[1] / "src" / "dif_frontend_flux2" / "default" / "tokenizer"
TEXT_ROWS = 32


def make_base(
    out: Path,
    vae_channels: list[int] | None = None,
    vae_groups: int | None = None,
    heads: int = 4,
    double_blocks: int = 1,
    single_blocks: int = 1,
) -> None:
    spec = importlib.util.spec_from_file_location("make_default_checkpoint", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.TRANSFORMER["num_attention_heads"] = heads
    script.TRANSFORMER["num_layers"] = double_blocks
    script.TRANSFORMER["num_single_layers"] = single_blocks
    script.VAE["sample_size"] = 256
    if vae_channels:
        script.VAE["block_out_channels"] = vae_channels
    if vae_groups:
        script.VAE["norm_num_groups"] = vae_groups
    script.MODEL_INDEX["max_sequence_length"] = TEXT_ROWS
    script.make(out, TOKENIZER)
    sys.path.insert(0, str(HERE))
    from text_encoder import quieten

    quieten(out / "text_encoder", out / "text_encoder")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vae-channels", default=None, help="comma-separated block widths, e.g. 16,32,32,32")
    ap.add_argument("--vae-groups", type=int, default=None, help="GroupNorm groups (divides every width)")
    ap.add_argument("--heads", type=int, default=4, help="transformer attention heads of 32 channels each")
    ap.add_argument("--double-blocks", type=int, default=1, help="transformer double-stream blocks")
    ap.add_argument("--single-blocks", type=int, default=1, help="transformer single-stream blocks")
    args = ap.parse_args()
    channels = [int(c) for c in args.vae_channels.split(",")] if args.vae_channels else None
    make_base(args.out, channels, args.vae_groups, args.heads, args.double_blocks, args.single_blocks)
