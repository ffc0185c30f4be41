"""`dif.progress`: the step line's rate covers the denoising steps only (decode and save after the last
step never count), load lines show bytes and GB/s at most 10 times a second, nothing listens or draws
when quiet. (Through a real pipeline run: tests/test_progress_pipeline.py.)"""

from __future__ import annotations

import io

import pytest

from dif.progress import ProgressBar, byte_callback, loading, stage_starting


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(stream: io.StringIO) -> list[str]:
    return [part.replace("\x1b[K", "") for part in stream.getvalue().replace("\n", "\r").split("\r") if part]


def test_the_step_rate_covers_the_steps_from_the_denoise_start_and_not_the_decode() -> None:
    clock, out = _Clock(), _Tty()
    with ProgressBar(stream=out, clock=clock) as bar:
        clock.now = 10.0
        stage_starting("encode")  # another stage: not the bar's start
        clock.now = 20.0
        stage_starting("denoise")
        for done in range(1, 5):
            clock.now = 20.0 + 0.5 * done
            bar.step(done, 4)
        clock.now = 95.0  # a long decode and save before the bar closes
    assert bar.rate == pytest.approx(2.0)
    assert _lines(out)[-1] == "denoise 4/4 [00:02<00:00, 2.00it/s]"
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1  # closed at the last step


def test_without_a_stage_start_the_rate_counts_the_steps_after_the_first() -> None:
    clock, out = _Clock(), _Tty()
    with ProgressBar(stream=out, clock=clock) as bar:
        for done, t in ((1, 5.0), (2, 9.0), (3, 13.0)):
            clock.now = t
            bar.step(done, 3)
    assert bar.rate == pytest.approx(0.25)
    assert _lines(out)[0] == "denoise 1/3" and _lines(out)[-1] == "denoise 3/3 [00:08<00:00, 4.00s/it]"


def test_load_lines_show_bytes_and_rate_at_most_ten_times_a_second() -> None:
    clock, out = _Clock(), _Tty()
    with ProgressBar(stream=out, clock=clock) as bar:
        report = byte_callback()
        assert report is not None
        with loading("flux2_transformer", 4 * 10**9):
            for i in range(1, 101):  # 100 chunks of 40 MB over one second
                clock.now = i / 100
                report(40 * 10**6)
        with loading("flux2_vae_decoder", 2 * 10**8):  # a backend that copies nothing (CPU: read when used)
            pass
    lines = _lines(out)
    assert 10 <= len(lines) <= 14  # begin + about one per 0.1 s + end, not one per chunk
    last = [line for line in lines if line.startswith("load flux2_transformer")][-1]
    assert last.startswith("load flux2_transformer: 4.00 GB of 4.00 GB at 4.00 GB/s")
    assert lines[-1] == "load flux2_vae_decoder: 0.20 GB of weights (read from the file when first used)"
    assert bar.copied_bytes == 4 * 10**9 and bar.mapped_bytes == 2 * 10**8
    assert byte_callback() is None  # the bar stopped listening when it closed


def test_a_quiet_bar_neither_listens_nor_draws() -> None:
    out = _Tty()
    with ProgressBar(stream=out, quiet=True) as bar:
        assert byte_callback() is None
        with loading("x", 10):
            pass
        bar.step(1, 1)
    assert out.getvalue() == ""
    with ProgressBar(stream=io.StringIO()):  # not a TTY
        assert byte_callback() is None
