"""The embedded demo model's text encoder: the random tiny Qwen3 with its residual branches quietened.

Training recipe stage 0 (outside the package). The text encoder is not trained (its 152k-row embedding
table would dominate a CPU budget); with the random layers at full scale a token's features at the
taps are mostly its context (" red" in two sentences: cosine 0.63, " red" vs " green" in the same
one: 0.87), so a denoiser could not learn words that generalise to new phrasings. Scaling every layer's
output projections (`o_proj`, `down_proj`) by BRANCH_SCALE keeps the architecture and the token
embeddings, and makes each tap close to its token's embedding plus a little context.

    python text_encoder.py SOURCE_DIR OUT_DIR      # the checkpoint's text_encoder/ folder
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

BRANCH_SCALE = 0.05


def quieten(source: Path, out: Path, scale: float = BRANCH_SCALE) -> None:
    from dif.serialize.diftensor import load_tensors, save_tensors

    tensors, _ = load_tensors(source / "model.safetensors")
    new = {}
    for name, value in tensors.items():
        v = np.array(value)
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            v = (v * scale).astype(v.dtype)
        new[name] = v
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(out / "model.safetensors", new, dif_metadata=False)
    if source.resolve() != out.resolve():
        shutil.copyfile(source / "config.json", out / "config.json")


if __name__ == "__main__":
    quieten(Path(sys.argv[1]), Path(sys.argv[2]))
