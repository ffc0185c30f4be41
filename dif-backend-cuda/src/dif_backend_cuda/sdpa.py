"""cuDNN fused attention (cudnn frontend's SDPA graph) for one `sdpa` node: fp16/bf16, grouped-query
heads, our [B, S, H, D] layout given to cuDNN as strides of its [B, H, S, D] view (tokens may be further
apart than H * D: views inside wider buffers, `dif.plan.views`). Built once at
prepare time over fixed device pointers; executing it is graph-capturable.

Eligibility (else the NVRTC flash kernel runs): fp16/bf16, no key mask, D == Dv, D a multiple of 8
and at most 256, and causal only when Sq == Skv (cuDNN's causal mask is top-left aligned).
"""

from __future__ import annotations

from typing import Any

from dif.dtypes import DType

TUNE_REPS = 3


class CudnnContext:
    """One cuDNN handle bound to the backend's stream, and the execution plan chosen per distinct graph
    (`build_fastest`)."""

    def __init__(self, stream: Any, tune: bool = True) -> None:
        import cudnn

        self.lib = cudnn
        self.stream = stream
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=stream.ptr)
        self.version = str(cudnn.backend_version())
        self.tune = tune
        self.tuned: dict[tuple[Any, ...], int] = {}

    def build_fastest(self, graph: Any, pack: dict[Any, int], key: tuple[Any, ...]) -> tuple[Any, str]:
        """Build `graph` (execution plans already created) with its fastest candidate plan, timed on its
        own buffers (CUDA events, best of `TUNE_REPS`) once per `key`; returns (workspace, summary).
        Building a plan at an index makes it the one `execute` runs. Without tuning, or when the
        frontend cannot build plans one at a time, cuDNN's own first choice is built."""
        import cupy

        try:
            count = int(graph.get_execution_plan_count()) if self.tune else 0
            if count > 1:
                return self._build_tuned(graph, pack, key, count)
        except Exception:  # noqa: BLE001 - an older frontend, or no plan could run: cuDNN's own choice
            self.stream.synchronize()
        graph.build_plans()
        return cupy.cuda.Memory(max(1, int(graph.get_workspace_size()))), "heuristic's first plan"

    def _build_tuned(self, graph: Any, pack: dict[Any, int], key: tuple[Any, ...], count: int) -> tuple[Any, str]:
        import cupy

        if key not in self.tuned:
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            best, best_ms = -1, float("inf")
            for index in range(count):
                try:
                    graph.build_plan_at_index(index)
                    workspace = cupy.cuda.Memory(max(1, int(graph.get_workspace_size())))
                    graph.execute(pack, workspace.ptr, handle=self.handle)
                    ms = float("inf")
                    for _ in range(TUNE_REPS):
                        start.record(self.stream)
                        graph.execute(pack, workspace.ptr, handle=self.handle)
                        end.record(self.stream)
                        end.synchronize()
                        ms = min(ms, cupy.cuda.get_elapsed_time(start, end))
                except Exception:  # noqa: BLE001 - a plan that cannot build or run is simply not chosen
                    self.stream.synchronize()
                    continue
                if ms < best_ms:
                    best, best_ms = index, ms
            if best < 0:
                raise RuntimeError(f"none of the {count} cuDNN execution plans could run")
            self.tuned[key] = best
        graph.build_plan_at_index(self.tuned[key])
        workspace = cupy.cuda.Memory(max(1, int(graph.get_workspace_size())))
        return workspace, f"plan {self.tuned[key] + 1} of {count}"


def eligible(dtype: DType, d: int, dv: int, sq: int, skv: int, masked: bool, causal: bool) -> str:
    """'' when cuDNN can run this attention, else the reason it cannot."""
    if dtype not in (DType.F16, DType.BF16):
        return f"dtype {dtype.value} (cuDNN SDPA takes fp16/bf16)"
    if masked:
        return "key mask"
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
        key = ("sdpa", dtype, b, sq, skv, hq, hkv, d, scale, causal, *token_strides)
        self.workspace, self.choice = ctx.build_fastest(g, self.pack, key)

    def __call__(self, stream: Any) -> None:
        self.graph.execute(self.pack, self.workspace.ptr, handle=self.ctx.handle)
