"""Fit the latent -> RGB preview projection of each frontend's embedded checkpoint against its VAE decoder
(`dif.preview.fit_projection`, 4 decodes of 32x32 random block latents, R^2 on a fifth) and write it as
preview_rgb.json in the frontend's package with the VAE file's size and SHA-256 (the projection is used only
for that VAE; any other checkpoint is fitted when a preview is asked for).

    python perf/fit_preview.py            # both frontends; prints the held-out R^2 of each
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import dif
from dif.preview import PROJECTION_FILE, _sha256, fit_projection, latent_channels

SAMPLES = 4


def main() -> int:
    for family in ("flux2", "krea2"):
        loaded = dif.load(family=family, backend="cpu", dtype="f32")
        pipe: Any = loaded.pipeline  # a frontend pipeline: it has a `checkpoint` with a `root` folder
        root = Path(pipe.checkpoint.root)
        vae = root / "vae" / "diffusion_pytorch_model.safetensors"
        projection = fit_projection(
            pipe.decode, latent_channels(pipe), pipe.dtype.np, source=f"{root.name} (perf/fit_preview.py)",
            samples=SAMPLES,
        )  # fmt: skip
        package = Path(str(__import__(type(pipe).__module__.split(".")[0]).__file__)).parent
        out = package / PROJECTION_FILE
        record = {**projection.to_json(), "vae_bytes": vae.stat().st_size, "vae_sha256": _sha256(vae)}
        record["fit"] = {"decodes": SAMPLES, "grid_tokens": 32, "block_tokens": 2, "ridge": 0.3}
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{family}: {projection.channels} channels -> RGB, held-out R^2 {projection.r2}  -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
