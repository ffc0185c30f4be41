"""Frame counts a video model accepts: `clip * n + keep` (n >= 0), where its video VAE decodes `clip`-frame
chunks after `keep` leading frames (MiniMax-H3: 17n + 5). The frontend's CLI and the HTTP server word their
own refusals around `nearest_frame_counts`."""

from __future__ import annotations


def nearest_frame_counts(frames: int, clip: int, keep: int) -> str | None:
    """None when `frames` is `clip * n + keep`; otherwise the valid counts around it ("22 or 39", or "5")."""
    if frames >= keep and (frames - keep) % clip == 0:
        return None
    below = (frames - keep) // clip * clip + keep if frames > keep else None
    return str(keep) if below is None else f"{below} or {below + clip}"
