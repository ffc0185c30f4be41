"""The optimizer: passes that rewrite a verified DiffIR program before the planner (see `manager`).

`optimize(program, target=profile)` runs the core pipeline and returns (program, decisions);
`dif.runtime.prepare` runs the pipeline `DIF_PASSES` selects. Fused ops live in `dif.ops.fused`.
"""

from dif.passes.context import (
    ALL_OPS_CAPABILITY,
    APPLIED,
    SKIPPED,
    PassContext,
    PassDecision,
    supports_op,
)
from dif.passes.fusions import (
    fuse_act_mul,
    fuse_gated_residual,
    fuse_linear_residual,
    fuse_norm_modulate,
    fuse_norm_rope,
)
from dif.passes.manager import (
    CORE_PASSES,
    DEFAULT_PASSES,
    available_passes,
    default_pipeline,
    optimize,
    plugin_passes,
    selected_passes,
    summarize,
)
from dif.passes.rewrite import Fusion, apply_fusions, fused_type_problem, merge_provenance, sole_use

__all__ = [
    "ALL_OPS_CAPABILITY",
    "APPLIED",
    "CORE_PASSES",
    "DEFAULT_PASSES",
    "SKIPPED",
    "Fusion",
    "PassContext",
    "PassDecision",
    "apply_fusions",
    "available_passes",
    "default_pipeline",
    "fuse_act_mul",
    "fuse_gated_residual",
    "fuse_linear_residual",
    "fuse_norm_modulate",
    "fuse_norm_rope",
    "fused_type_problem",
    "merge_provenance",
    "optimize",
    "plugin_passes",
    "selected_passes",
    "sole_use",
    "summarize",
    "supports_op",
]
