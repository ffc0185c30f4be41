"""cuDNN fused attention (cudnn frontend's SDPA graph) for one `sdpa` node: fp16/bf16, grouped-query
heads, our [B, S, H, D] layout given to cuDNN as strides of its [B, H, S, D] view. Built once at
prepare time over fixed device pointers; executing it is graph-capturable.

Eligibility (else the NVRTC flash kernel runs): fp16/bf16, no key mask, D == Dv, D a multiple of 8
and at most 256, and causal only when Sq == Skv (cuDNN's causal mask is top-left aligned).
"""

from __future__ import annotations

from typing import Any

from dif.dtypes import DType


class CudnnContext:
    """One cuDNN handle bound to the backend's stream."""

    def __init__(self, stream: Any) -> None:
        import cudnn

        self.lib = cudnn
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=stream.ptr)
        self.version = str(cudnn.backend_version())


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
    ) -> None:
        import cupy

        cudnn = ctx.lib
        dt = cudnn.data_type.BFLOAT16 if dtype == DType.BF16 else cudnn.data_type.HALF
        fp32 = cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=fp32, compute_data_type=fp32, handle=ctx.handle)

        def bshd(name: str, s: int, h: int) -> Any:
            return g.tensor(name=name, dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=dt)

        tq, tk, tv = bshd("q", sq, hq), bshd("k", skv, hkv), bshd("v", skv, hkv)
        kwargs = {"name": "sdpa", "q": tq, "k": tk, "v": tv, "attn_scale": scale, "use_causal_mask": causal}
        try:
            out, _stats = g.sdpa(generate_stats=False, **kwargs)
        except TypeError:  # older frontends spell it is_inference
            out, _stats = g.sdpa(is_inference=True, **kwargs)
        out.set_output(True).set_dim([b, hq, sq, d]).set_stride([sq * hq * d, d, hq * d, 1]).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.ctx, self.graph = ctx, g
        self.workspace = cupy.cuda.Memory(max(1, int(g.get_workspace_size())))
        self.pack = {tq: q, tk: k, tv: v, out: o}

    def __call__(self, stream: Any) -> None:
        self.graph.execute(self.pack, self.workspace.ptr, handle=self.ctx.handle)
