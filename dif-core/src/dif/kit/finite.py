"""Finite checks of a run: the host arrays at each stage boundary (text features, every denoiser
step's velocity and latents, the decoded image) and the policy for non-finite weights.

Where it sits: the pipelines call `require_finite` on arrays they already hold on the host (one
pass each, `dif.weights.scan.count_nonfinite`: ~0.1 ms for 1024x1024 FLUX.2 latents); `bind_weights` asks
`current_checks()` what to do with a weight scan's findings. A command or the Python API sets the
policy for one run with `run_checks(...)` (`--no-check-finite`, `--allow-nonfinite-weights`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import NonFiniteError


@frozen
class RunChecks:
    """What a run checks. finite: stop at the first stage output with a NaN or an infinity;
    allow_nonfinite_weights: a weight with NaN / inf values warns instead of refusing the load."""

    finite: bool = True
    allow_nonfinite_weights: bool = False


DEFAULT_CHECKS = RunChecks()
FLOAT_NAMES = ("bfloat", "float8")  # ml_dtypes' floats, whose numpy kind is "V"
_CHECKS: ContextVar[RunChecks] = ContextVar("dif_run_checks", default=DEFAULT_CHECKS)
NONFINITE_HINT = (
    "check the weights (`dif weights stats MODEL`) and the --init-noise file, or try --dtype f32; "
    "--no-check-finite runs on regardless"
)


def current_checks() -> RunChecks:
    """The checks of the run in progress (the defaults outside any `run_checks`)."""
    return _CHECKS.get()


@contextmanager
def run_checks(*, finite: bool = True, allow_nonfinite_weights: bool = False) -> Iterator[RunChecks]:
    """Run the body under these checks; the previous ones come back after it."""
    checks = RunChecks(finite=finite, allow_nonfinite_weights=allow_nonfinite_weights)
    token = _CHECKS.set(checks)
    try:
        yield checks
    finally:
        _CHECKS.reset(token)


def require_finite(stage: str, value: Any, *, step: tuple[int, int] | None = None) -> Any:
    """`value` itself when every float array in it (an array, or the array attributes of an
    object such as a frontend's encoded prompt) is finite, or finite checks are off; otherwise a
    `NonFiniteError` naming `stage` and `step` = (step, total steps) and what was found."""
    if not _CHECKS.get().finite:
        return value
    from dif.weights.scan import count_nonfinite

    for name, array in _float_arrays(value):
        if count_nonfinite(array):
            raise _nonfinite(stage if not name else f"{stage} ({name})", array, step)
    return value


def require_finite_probe(stage: str, probe: np.ndarray, *, step: tuple[int, int] | None = None) -> None:
    """`require_finite` for a tensor that stayed on the device: `probe` is its `dif.layers.probe.finite_probe`
    (0 when finite, NaN otherwise)."""
    if not _CHECKS.get().finite or np.isfinite(probe).all():
        return
    at = f" at step {step[0]} of {step[1]}" if step is not None else ""
    raise NonFiniteError(
        f"{stage}{at} has non-finite values (NaN or infinite, found on the device); the run is stopped, "
        "nothing is written",
        hint=NONFINITE_HINT,
    )


def _float_arrays(value: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(attribute name or "", array) of each float array in `value`; bool and integer arrays are skipped."""
    if isinstance(value, np.ndarray):
        items: list[tuple[str, Any]] = [("", value)]
    else:
        names = [*getattr(value, "__dict__", {}), *getattr(type(value), "__slots__", ())]
        items = [(name, getattr(value, name, None)) for name in names]
    for name, item in items:
        if isinstance(item, np.ndarray) and (item.dtype.kind == "f" or item.dtype.name.startswith(FLOAT_NAMES)):
            yield name, item


def _nonfinite(stage: str, array: np.ndarray, step: tuple[int, int] | None) -> NonFiniteError:
    x = np.asarray(array, dtype=np.float32)
    nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    at = f" at step {step[0]} of {step[1]}" if step is not None else ""
    found = ", ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else "") if part)
    return NonFiniteError(
        f"{stage}{at} has non-finite values: {found} of {x.size} (shape {list(x.shape)}); the run is stopped, "
        "nothing is written",
        hint=NONFINITE_HINT,
    )
