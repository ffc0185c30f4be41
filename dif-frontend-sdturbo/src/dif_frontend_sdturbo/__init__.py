"""dif frontend for SD-Turbo (Stable Diffusion 2.x UNet, 1 step) and its TAESD fast decoder: checkpoint
binding, DiffIR builders, the text-to-image pipeline and the `dif sdturbo` commands. Importing this
package loads nothing heavy; see `plugin.py`.
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"
"""The embedded tiny checkpoint (random weights, SD-Turbo layout, with a TAESD folder) used when no
--model is given."""

__all__ = ["DEFAULT_CHECKPOINT", "__version__"]
