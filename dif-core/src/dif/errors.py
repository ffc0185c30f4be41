"""One error hierarchy for every layer of dif.

Each error says what failed, where (file / tensor / op id / backend) and, when we know it, how
to fix it. Tools catch `DifError` at the top and exit non-zero with its message; anything else
escaping is a bug in dif.
"""

from __future__ import annotations


class DifError(Exception):
    """Base of every error dif raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class FormatError(DifError):
    """A file is not a valid dif/safetensors artifact (bad magic, version, checksum, truncation)."""


class ChecksumError(FormatError):
    """The bytes of a file do not match the checksum recorded in it."""


class VersionError(FormatError):
    """A file was written by an incompatible format version."""


class TypeRuleError(DifError):
    """Operands or attributes do not satisfy an op's type rule."""


class UnknownOpError(DifError):
    """An op name is not in the op table."""


class AttrError(DifError):
    """An attribute is missing, unknown, or of the wrong kind / value."""


class VerifyError(DifError):
    """A program breaks a DiffIR invariant (see `dif.verify`)."""


class ParseError(DifError):
    """The DiffIR text form could not be parsed."""


class PlanError(DifError):
    """A plan could not be made, or does not fit the program."""


class PlanBindingError(PlanError):
    """A `.difplan` is bound to a different compiler, target or budget than the one replaying it."""


class WeightError(DifError):
    """A checkpoint tensor is missing, unexpected, mis-shaped or mis-typed."""


class CheckpointError(DifError):
    """A checkpoint folder or file cannot be read or is not of a recognised layout."""


class ConfigError(CheckpointError):
    """A config.json / model_index.json is missing, malformed or describes an unsupported model."""


class BackendError(DifError):
    """A backend cannot run something (unavailable, op not implemented, device failure)."""


class DeviceMemoryError(BackendError):
    """A backend could not allocate memory a program asked for (numpy MemoryError, CUDA or OpenCL out of memory)."""

    def __init__(
        self, backend: str, program: str, nbytes: int, what: str, free_bytes: int | None, detail: str = ""
    ) -> None:
        free = "free memory unknown" if free_bytes is None else f"{free_bytes} B free"
        why = f": {detail}" if detail else ""
        super().__init__(
            f"{backend} backend: program '{program or '?'}' could not allocate {nbytes} B for its {what} ({free}){why}",
            hint="plan for less device memory with --vram-budget SIZE (weights beyond it stream from host memory), "
            "use a smaller image size, or free device memory",
        )
        self.backend, self.program, self.nbytes, self.what, self.free_bytes = backend, program, nbytes, what, free_bytes
        self.detail = detail


class BackendUnavailableError(BackendError):
    """The backend's hardware or libraries are not present on this machine."""


class NotImplementedOnBackend(BackendError):
    """An op (or dtype of it) has no implementation on a backend."""

    def __init__(self, op: str, backend: str, detail: str = "") -> None:
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"no implementation of op '{op}' on backend '{backend}'{extra}",
            hint="run on another backend (--backend cpu) or add a lowering for the op",
        )
        self.op = op
        self.backend = backend


class PluginError(DifError):
    """A plugin misbehaved while registering (duplicate names, bad hookimpl)."""


class UsageError(DifError):
    """A user-facing option has an invalid value (size not a multiple of 16, ...)."""


class NonFiniteError(DifError):
    """A stage output, a weight or an input holds NaN or infinite values (`dif.kit.finite`)."""


class DifWarning(UserWarning):
    """Something the user should know that does not stop the work (a stale cache entry rebuilt, ...).
    Tools print it as one `warning: ...` line on stderr."""
