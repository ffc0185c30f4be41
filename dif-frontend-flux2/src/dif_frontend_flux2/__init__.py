"""dif frontend for FLUX.2 [klein]: checkpoint layouts, DiffIR builders, the text-to-image pipeline
and the `dif flux2` commands. Importing this package loads nothing heavy; see `plugin.py`.
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"
"""The embedded tiny checkpoint (trained on drawn, captioned shapes) used when no --model is given."""

__all__ = ["DEFAULT_CHECKPOINT", "__version__"]
