"""cuDNN fused attention (cudnn frontend's SDPA graph) for one `sdpa` node: fp16/bf16, grouped-query
heads, our [B, S, H, D] layout given to cuDNN as strides of its [B, H, S, D] view (tokens may be further
apart than H * D: views inside wider buffers, `dif.plan.views`). Built once at
prepare time over fixed device pointers; executing it is graph-capturable.

Eligibility (else the NVRTC flash kernel runs): fp16/bf16, D == Dv, D a multiple of 8 and at most 256,
and causal only when Sq == Skv (cuDNN's causal mask is top-left aligned). A key mask reaches cuDNN as an
additive score bias [B, 1, 1, Skv] (`key_bias`; [B, 1, Sq, Skv] where cuDNN refuses to broadcast over the
queries), which the lowering fills from the mask on every run and follows with a kernel zeroing the query
rows whose keys are all masked (kernels/attention.cu).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dif.dtypes import DType

if TYPE_CHECKING:
    from dif_backend_cuda.tuning import Choices


class CudnnContext:
    """One cuDNN handle bound to the backend's stream, and the execution plan chosen per distinct graph
    (`build_fastest`, through `tuning.Choices`)."""

    def __init__(self, stream: Any, choices: Callable[[str], Choices] | None = None) -> None:
        import cudnn

        self.lib = cudnn
        self.stream = stream
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=stream.ptr)
        self.version = str(cudnn.backend_version())
        # `choices(version)`: the backend's store of plan choices for this cuDNN version (None: cuDNN's own)
        self.choices = choices(f"cudnn {self.version}") if choices is not None else None

    def build_fastest(self, graph: Any, pack: dict[Any, int], key: tuple[Any, ...]) -> tuple[Any, str]:
        """Build `graph` (execution plans already created) with the plan `tuning.Choices` picks for `key`:
        a stored choice, else (tuning on) the fastest candidate timed on its own buffers, else cuDNN's own
        first choice; returns (workspace, summary). Building a plan at an index makes it the one `execute`
        runs; a stored index that no longer builds falls back to cuDNN's choice."""
        import cupy

        try:
            count = int(graph.get_execution_plan_count()) if self.choices is not None else 0
            if count > 1:
                assert self.choices is not None
                index, how = self.choices.choose(key, count, lambda: self._fastest_plan(graph, pack, count))
                if how != "heuristic":
                    graph.build_plan_at_index(index)
                    workspace = cupy.cuda.Memory(max(1, int(graph.get_workspace_size())))
                    return workspace, f"plan {index + 1} of {count} ({how})"
        except Exception:  # noqa: BLE001 - an older frontend, or no plan could run: cuDNN's own choice
            self.stream.synchronize()
        graph.build_plans()
        return cupy.cuda.Memory(max(1, int(graph.get_workspace_size()))), "heuristic's first plan"

    def _fastest_plan(self, graph: Any, pack: dict[Any, int], count: int) -> int:
        """Every plan built once, then timed by index (a plan that did not build fails there and is dropped)."""
        import cupy

        from dif_backend_cuda.tuning import fastest

        graph.build_plans(self.lib.build_plan_policy.ALL)
        need = 1
        for index in range(count):
            try:
                need = max(need, int(graph.get_workspace_size_plan_at_index(index)))
            except Exception:  # noqa: BLE001 - not built
                continue
        scratch = cupy.cuda.Memory(need)

        def run(index: int) -> None:
            graph.execute_plan_at_index(pack, scratch.ptr, index, handle=self.handle)

        return fastest(run, count, self.stream)[0]


def eligible(dtype: DType, d: int, dv: int, sq: int, skv: int, causal: bool) -> str:
    """'' when cuDNN can run this attention, else the reason it cannot."""
    if dtype not in (DType.F16, DType.BF16):
        return f"dtype {dtype.value} (cuDNN SDPA takes fp16/bf16)"
    if d != dv or d % 8 or d > 256:
        return f"head dims q/k {d}, v {dv}"
    if causal and sq != skv:
        return "causal with Sq != Skv"
    return ""


class CudnnSdpa:
    """A built cuDNN SDPA graph with its variant pack and workspace."""

    kind = "cudnn"

    def __init__(
        self,
        ctx: CudnnContext,
        dtype: DType,
        b: int,
        sq: int,
        skv: int,
        hq: int,
        hkv: int,
        d: int,
        q: int,
        k: int,
        v: int,
        o: int,
        scale: float,
        causal: bool,
        token_strides: list[int],
        key_bias: int = 0,
        bias_rows: int = 1,
    ) -> None:
        cudnn = ctx.lib
        dt = cudnn.data_type.BFLOAT16 if dtype == DType.BF16 else cudnn.data_type.HALF
        fp32 = cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=fp32, compute_data_type=fp32, handle=ctx.handle)

        qt, kt, vt, ot = token_strides  # elements between tokens: h * d, or more for a view in a wider buffer

        def bshd(name: str, s: int, h: int, t: int) -> Any:
            return g.tensor(name=name, dim=[b, h, s, d], stride=[s * t, d, t, 1], data_type=dt)

        tq, tk, tv = bshd("q", sq, hq, qt), bshd("k", skv, hkv, kt), bshd("v", skv, hkv, vt)
        kwargs = {"name": "sdpa", "q": tq, "k": tk, "v": tv, "attn_scale": scale, "use_causal_mask": causal}
        if key_bias:  # [B, 1, bias_rows, Skv] added to every head's (and, with 1 row, every query's) scores
            n = bias_rows * skv
            tb = g.tensor(name="bias", dim=[b, 1, bias_rows, skv], stride=[n, n, skv, 1], data_type=dt)
            kwargs["bias"] = tb
        try:
            out, _stats = g.sdpa(generate_stats=False, **kwargs)
        except TypeError:  # older frontends spell it is_inference
            out, _stats = g.sdpa(is_inference=True, **kwargs)
        out.set_output(True).set_dim([b, hq, sq, d]).set_stride([sq * ot, d, ot, 1]).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self.ctx, self.graph = ctx, g
        self.pack = {tq: q, tk: k, tv: v, out: o}
        if key_bias:
            self.pack[kwargs["bias"]] = key_bias
        key = ("sdpa", dtype, b, sq, skv, hq, hkv, d, scale, causal, bool(key_bias), bias_rows, *token_strides)
        self.workspace, self.choice = ctx.build_fastest(g, self.pack, key)

    def __call__(self, stream: Any) -> None:
        self.graph.execute(self.pack, self.workspace.ptr, handle=self.ctx.handle)
