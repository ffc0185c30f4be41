"""dif frontend for MiniMax-H3 (text -> video + audio): checkpoint binding, the packed-sequence DiT and
Qwen3-VL text encoder as DiffIR builders, the two flow schedules, the t2va pipeline, MP4 output and the
`dif h3` commands. Importing this package loads nothing heavy; see `plugin.py`.
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "default"
"""The embedded tiny checkpoint (random weights) used when no --model is given."""

__all__ = ["DEFAULT_CHECKPOINT", "__version__"]
