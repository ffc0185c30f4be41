"""dif frontend for Krea 2 (Raw and Turbo): checkpoint binding, DiffIR builders, the text-to-image
pipeline and the `dif krea2` commands. Importing this package loads nothing heavy; see `plugin.py`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
