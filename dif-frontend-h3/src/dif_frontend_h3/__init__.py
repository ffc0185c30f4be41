"""dif-frontend-h3: MiniMax-H3 frontend (placeholder; the real code comes in a later issue)."""

__version__ = "0.0.1"
