"""Copy a trained embedded model into the package's default checkpoint folder.

Training recipe stage 5 (outside the package; also between the two transformer runs): `transformer/`
from the run's exported model, `vae/` and `text_encoder/` from the working checkpoint (links resolved, f32
as before) and model_index.json (its `max_sequence_length`) from the working checkpoint; the tokenizer
and scheduler are left as they are.

    python install_default.py WORK_CHECKPOINT RUN_MODEL [DEFAULT_DIR]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[2] / "src" / "dif_frontend_flux2" / "default"
FILES = {
    "transformer": ("config.json", "diffusion_pytorch_model.safetensors"),
    "vae": ("config.json", "diffusion_pytorch_model.safetensors"),
    "text_encoder": ("config.json", "model.safetensors"),
}


def install(work: Path, run_model: Path, default: Path = DEFAULT) -> None:
    if (work / "model_index.json").resolve() != (default / "model_index.json").resolve():
        shutil.copyfile(work / "model_index.json", default / "model_index.json")
    for component, names in FILES.items():
        src = (run_model if component == "transformer" else work) / component
        for name in names:
            if (src / name).resolve() == (default / component / name).resolve():
                continue
            shutil.copyfile((src / name).resolve(), default / component / name)
            print(f"{default / component / name}  <-  {(src / name).resolve()}")


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    install(*args)  # type: ignore[arg-type]
