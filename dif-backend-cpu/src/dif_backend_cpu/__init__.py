"""dif-backend-cpu: the reference backend. Executes a DiffIR program by following its Plan (one
numpy arena, planned offsets) with the op table's numpy references; bf16/fp8 via ml_dtypes.

Registered with dif through the `dif` entry point (`dif_backend_cpu.plugin`), like any third party.
"""

from dif_backend_cpu.device import CpuBackend, host_budget, host_profile
from dif_backend_cpu.executor import ArenaExecutable

__version__ = "0.1.0"

__all__ = ["ArenaExecutable", "CpuBackend", "__version__", "host_budget", "host_profile"]
