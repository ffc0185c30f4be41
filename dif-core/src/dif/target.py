"""What a backend can do (TargetProfile, static) and what it has right now (RuntimeBudget).

The planner and the physical-format registry decide legality from these records alone, never
from a device name. A profile's fingerprint binds plans to the capability they were made for.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import cattrs
from attrs import field, frozen

from dif._convert import strs

_converter = cattrs.Converter()


@frozen
class TargetProfile:
    """Static capability of one device as a backend sees it."""

    backend: str
    device: str
    arch: str = ""
    compute_units: int = 0
    memory_bytes: int = 0
    dtypes: tuple[str, ...] = field(default=(), converter=strs)
    tensor_core_formats: tuple[str, ...] = field(default=(), converter=strs)
    capabilities: tuple[str, ...] = field(default=(), converter=strs)
    libraries: dict[str, str] = field(factory=dict)
    host_threshold_bytes: int | None = None
    """Nodes touching at most this many bytes run faster on the host than as a launch (measured by the
    backend); the planner places such host-known nodes there (`dif.plan.placement`). None: all on the device."""

    def fingerprint(self) -> str:
        """Hash of everything that affects what a plan may assume (not free memory)."""
        doc = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return _converter.unstructure(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetProfile:
        return _converter.structure(data, cls)


@frozen
class RuntimeBudget:
    """Dynamic resources at the moment of planning: these may change between runs."""

    free_memory_bytes: int
    host_memory_bytes: int = 0
    pinned_staging_bytes: int = 0
    workspace_bytes: int = 0

    @property
    def budget_class(self) -> str:
        """Coarse size class of the memory budget (power-of-two GiB), bound into plans."""
        gib = max(1, self.free_memory_bytes >> 30)
        return f"{1 << (gib.bit_length() - 1)}GiB+"

    def to_dict(self) -> dict[str, Any]:
        return _converter.unstructure(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeBudget:
        return _converter.structure(data, cls)
