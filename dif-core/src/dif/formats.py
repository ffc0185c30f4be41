"""Physical formats: what a weight or activation may be stored and computed in, and where that is legal.

The optimizer asks this registry which formats to try on a target; `dif formats-table` prints it.
Legality is read from a `TargetProfile`'s lists only, never from a device name:

- `TargetProfile.dtypes` holds DiffIR dtype names the backend can store and compute
  (`f32`, `bf16`, `f8e4m3`, `i8`, `u8`, ...; see `dif.dtypes.DType`).
- `TargetProfile.tensor_core_formats` holds matrix-unit formats, from this vocabulary:
  `tf32 bf16 fp16 fp8-e4m3 fp8-e5m2 int8 int4 nvfp4`.
- `TargetProfile.capabilities` holds free-form feature strings a format may require.

How dif can use a format is one of three kinds (`Usage`): a search candidate (a DiffIR transform
the optimizer measures), an execution policy (reported and applied by a backend, not searched),
or a hook only (identity and requirements registered, no implementation yet). A format that needs
backend code (every execution policy, and a search candidate that is more than a plain cast, such
as fp8-e4m3) names the capability a backend lists when it implements it (`implemented_by`,
"format:NAME" by default for execution policies, set explicitly otherwise); on a backend that does
not list it the format is reported as hook only, with that reason, whatever its registered usage.
So a format is only searchable on a backend that declares it can run it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from attrs import field, frozen

from dif._convert import strs
from dif.errors import PluginError, UsageError
from dif.target import TargetProfile

TENSOR_CORE_FORMATS = ("tf32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "int8", "int4", "nvfp4")


class Usage(enum.StrEnum):
    SEARCH_CANDIDATE = "search candidate"
    EXECUTION_POLICY = "execution policy"
    HOOK_ONLY = "hook only"


@frozen
class PhysicalFormat:
    """A storage/compute format. `bits` is the storage cost per element including scales."""

    name: str
    description: str
    storage_dtype: str
    bits: float
    usage: Usage = field(converter=Usage)
    usage_reason: str
    scale: str = "none"  # none | per-tensor | per-channel | per-group
    group_size: int = 0
    requires_dtypes: tuple[str, ...] = field(default=(), converter=strs)
    requires_tensor_core: tuple[str, ...] = field(default=(), converter=strs)
    requires_capabilities: tuple[str, ...] = field(default=(), converter=strs)
    # The `TargetProfile.capabilities` entry of a backend that implements this format; "" when the
    # format needs no backend code. Defaults to "format:NAME" for execution policies.
    implemented_by: str = field()

    @implemented_by.default
    def _implemented_by(self) -> str:
        return f"format:{self.name}" if self.usage is Usage.EXECUTION_POLICY else ""


@frozen
class FormatVerdict:
    """One row of the formats table: a format judged against one target."""

    format: str
    legal: bool
    reason: str
    usage: Usage
    usage_reason: str
    executes: str = ""  # `execution_on`: executed | emulated | not executed, with why

    @property
    def searchable(self) -> bool:
        """True when the optimizer may measure this format on the target."""
        return self.legal and self.usage is Usage.SEARCH_CANDIDATE

    def to_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "legal": self.legal,
            "reason": self.reason,
            "usage": self.usage.value,
            "usage_reason": self.usage_reason,
            "searchable": self.searchable,
            "executes": self.executes,
        }


class FormatRegistry:
    """Name -> PhysicalFormat. Core formats are registered below; plugins add theirs by hook."""

    def __init__(self) -> None:
        self._formats: dict[str, PhysicalFormat] = {}

    def register(self, fmt: PhysicalFormat) -> None:
        if not isinstance(fmt, PhysicalFormat):
            raise PluginError(f"register_physical_formats expects a PhysicalFormat, got {type(fmt).__name__}")
        existing = self._formats.get(fmt.name)
        if existing is not None and existing != fmt:
            raise PluginError(f"physical format '{fmt.name}' is already registered")
        self._formats[fmt.name] = fmt

    def get(self, name: str) -> PhysicalFormat:
        try:
            return self._formats[name]
        except KeyError:
            raise UsageError(
                f"unknown physical format '{name}'", hint=f"known formats: {', '.join(self._formats)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._formats

    def __iter__(self) -> Iterator[PhysicalFormat]:
        return iter(self._formats.values())

    def __len__(self) -> int:
        return len(self._formats)


FORMATS = FormatRegistry()


def _missing(kind: str, needed: tuple[str, ...], have: tuple[str, ...]) -> str | None:
    lacking = [n for n in needed if n not in have]
    if not lacking:
        return None
    listed = ", ".join(have) or "none"
    return f"target lists no {kind} {', '.join(repr(n) for n in lacking)} (it lists: {listed})"


def legal_on(fmt: PhysicalFormat | str, profile: TargetProfile) -> tuple[bool, str]:
    """(legal, reason): whether `profile` has every dtype, tensor-core format and capability `fmt` needs."""
    if isinstance(fmt, str):
        fmt = FORMATS.get(fmt)
    checks = (
        ("dtype", fmt.requires_dtypes, profile.dtypes),
        ("tensor-core format", fmt.requires_tensor_core, profile.tensor_core_formats),
        ("capability", fmt.requires_capabilities, profile.capabilities),
    )
    for kind, needed, have in checks:
        problem = _missing(kind, needed, have)
        if problem is not None:
            return False, problem
    needs = [f"{kind} {n}" for kind, needed, _ in checks for n in needed]
    return True, f"target lists {', '.join(needs)}" if needs else "no requirements"


def usage_on(fmt: PhysicalFormat | str, profile: TargetProfile) -> tuple[Usage, str]:
    """(usage, reason) of `fmt` on `profile`: its registered usage when it needs no backend code or
    the backend lists `fmt.implemented_by`; otherwise hook only, saying which capability is missing."""
    if isinstance(fmt, str):
        fmt = FORMATS.get(fmt)
    if not fmt.implemented_by or fmt.implemented_by in profile.capabilities:
        return fmt.usage, fmt.usage_reason
    return Usage.HOOK_ONLY, (
        f"backend '{profile.backend}' has no implementation (its profile lists no capability "
        f"'{fmt.implemented_by}'); where a backend does: {fmt.usage.value}, {fmt.usage_reason}"
    )


def assess(fmt: PhysicalFormat | str, profile: TargetProfile) -> FormatVerdict:
    """The formats-table row for `fmt` on `profile`."""
    if isinstance(fmt, str):
        fmt = FORMATS.get(fmt)
    legal, reason = legal_on(fmt, profile)
    usage, why = usage_on(fmt, profile)
    return FormatVerdict(fmt.name, legal, reason, usage, why, execution_on(fmt, profile))


def execution_on(fmt: PhysicalFormat | str, profile: TargetProfile) -> str:
    """What `profile`'s backend does with `fmt`, from the code that exists: "executed" (no backend code
    needed, or the backend lists `implemented_by` and the target is legal), "emulated" (the backend runs the
    format's ops, but the target lacks the matrix units or dtypes that make it pay: the CPU reference), or
    "not executed" (no implementation), each with why."""
    if isinstance(fmt, str):
        fmt = FORMATS.get(fmt)
    if fmt.usage is Usage.HOOK_ONLY and not fmt.implemented_by:
        return "not executed: identity and requirements registered only"
    if fmt.implemented_by and fmt.implemented_by not in profile.capabilities:
        return f"not executed: backend '{profile.backend}' lists no '{fmt.implemented_by}'"
    legal, reason = legal_on(fmt, profile)
    if legal:
        return "executed" + (f" ({fmt.implemented_by})" if fmt.implemented_by else "")
    return f"emulated: backend '{profile.backend}' runs its ops, but {reason}"


def formats_table(profile: TargetProfile, registry: FormatRegistry = FORMATS) -> list[FormatVerdict]:
    """Every registered format judged against `profile`, in registration order."""
    return [assess(fmt, profile) for fmt in registry]


def _core(*formats: PhysicalFormat) -> None:
    for fmt in formats:
        FORMATS.register(fmt)


_core(
    PhysicalFormat(
        name="fp32",
        description="IEEE float32 weights and activations (the reference precision)",
        storage_dtype="f32",
        bits=32,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="baseline every other candidate is measured against",
        requires_dtypes=("f32",),
    ),
    PhysicalFormat(
        name="bf16",
        description="bfloat16 weights and activations, fp32 accumulation",
        storage_dtype="bf16",
        bits=16,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="a cast transform of the DiffIR program",
        requires_dtypes=("bf16",),
    ),
    PhysicalFormat(
        name="fp16",
        description="float16 weights and activations, fp32 accumulation",
        storage_dtype="f16",
        bits=16,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="a cast transform of the DiffIR program",
        requires_dtypes=("f16",),
    ),
    PhysicalFormat(
        name="fp8-e4m3",
        description="float8 e4m3 W8A8 linears: weights per output channel (scaled at load), activations per "
        "row (scaled by the kernel producing them), fp32 accumulation, scales in the GEMM epilogue",
        storage_dtype="f8e4m3",
        bits=8 + 32 / 4096,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="the quantize_fp8 pass (dif.passes.quantize), measured by the format search; "
        "fp8-e4m3+attention adds quantize_fp8_attention",
        scale="per-channel",
        requires_dtypes=("f8e4m3",),
        requires_tensor_core=("fp8-e4m3",),
        # Listing the dtype is not enough: the candidate needs the quantized ops' lowerings (scaled_linear on
        # fp8 matrix units, norm_modulate_quant). A backend that has them lists this capability.
        implemented_by="format:fp8-e4m3",
    ),
    PhysicalFormat(
        name="fp8-e5m2",
        description="float8 e5m2 (wider range, 2 mantissa bits)",
        storage_dtype="f8e5m2",
        bits=8,
        usage=Usage.HOOK_ONLY,
        usage_reason="identity and requirements registered; no inference lowering (a gradient format)",
        scale="per-tensor",
        requires_dtypes=("f8e5m2",),
        requires_tensor_core=("fp8-e5m2",),
    ),
    PhysicalFormat(
        name="int8",
        description="int8 W8A8 linears: weights per output channel (scaled at load), activations per row "
        "(scaled by the kernel producing them), int32 accumulation, scales in the epilogue",
        storage_dtype="i8",
        bits=8 + 32 / 4096,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="the quantize_int8 pass (dif.passes.quantize), measured by the format search",
        scale="per-channel",
        requires_dtypes=("i8",),
        requires_tensor_core=("int8",),
        implemented_by="format:int8",
    ),
    PhysicalFormat(
        name="int4-group",
        description="weight-only 4-bit linears: weights packed two per byte, one fp16 scale per group of 128 "
        "inputs (64 where the inputs do not divide by 128), dequantized inside the GEMM kernel",
        storage_dtype="u8",
        bits=4 + 16 / 128,
        usage=Usage.SEARCH_CANDIDATE,
        usage_reason="the quantize_int4 pass (dif.passes.quantize), measured by the format search (saves memory)",
        scale="per-group",
        group_size=128,
        requires_dtypes=("u8",),
        implemented_by="format:int4-group",
    ),
    PhysicalFormat(
        name="nvfp4",
        description="4-bit e2m1 floats, one fp8 scale per 16 elements (block-scaled matrix units)",
        storage_dtype="u8",
        bits=4 + 8 / 16,
        usage=Usage.HOOK_ONLY,
        usage_reason="identity and requirements registered; no backend implementation yet",
        scale="per-group",
        group_size=16,
        requires_dtypes=("u8",),
        requires_tensor_core=("nvfp4",),
    ),
)
