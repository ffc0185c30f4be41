"""dif frontend for Krea 2 (Raw and Turbo): checkpoint binding, DiffIR builders, the text-to-image
pipeline and the `dif krea2` commands. Importing this package loads nothing heavy; see `plugin.py`.
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"
"""The embedded tiny checkpoint (random weights, Turbo) used when no --model is given."""

__all__ = ["DEFAULT_CHECKPOINT", "__version__"]
