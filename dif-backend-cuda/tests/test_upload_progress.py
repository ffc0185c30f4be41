"""`upload` without an `on_bytes` reports to the open `dif.progress.ProgressBar` (the load line's bytes and
GB/s), on the fake cupy of test_upload.py; with no bar open it reports to nobody."""

from __future__ import annotations

import io
import types

import numpy as np

from dif.progress import ProgressBar, byte_callback, loading
from dif_backend_cuda.upload import upload

from .test_upload import fake  # noqa: F401  (the fake-cupy fixture)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_upload_reports_its_chunks_to_the_open_bar(fake: list[tuple[int, int]]) -> None:  # noqa: F811
    device = np.zeros(20_000, np.uint8)
    weights = np.arange(3000, dtype=np.float32)  # 12000 B: twelve 1000-byte chunks
    stream = types.SimpleNamespace(synchronize=lambda: None)
    out = _Tty()
    with ProgressBar(stream=out) as bar, loading("denoiser", weights.nbytes):
        upload(device.ctypes.data, [(0, weights)], stream)
    assert bar.copied_bytes == weights.nbytes and bar.mapped_bytes == 0
    assert "load denoiser: " in out.getvalue() and "GB/s" in out.getvalue()
    assert np.array_equal(device[: weights.nbytes].view(np.float32), weights)
    assert byte_callback() is None
    upload(device.ctypes.data, [(0, weights)], stream)  # no bar: nothing to report to, nothing fails
