"""cuDNN convolution (cudnn frontend graph, `conv_fprop`) for one fp16/bf16 `conv2d` node in DiffIR's
NCHW layout, given to cuDNN as strides; fp32 accumulation. One graph per distinct problem, shared by the
nodes of that problem (`CudnnContext.shared_graph`); executing it is graph-capturable. The bias, when
present, is a separate broadcast add (see `lower/conv.py`). Eligibility (else the NVRTC implicit GEMM
runs): fp16/bf16, one group, symmetric padding. fp32 stays on the NVRTC kernel: cuDNN may use TF32 for it.
"""

from __future__ import annotations

from typing import Any

from dif.dtypes import DType
from dif_backend_cuda.sdpa import UIDS, CudnnContext, GraphStep, finish_graph


def eligible(dtype: DType, groups: int, padding: tuple[int, int, int, int]) -> str:
    """'' when cuDNN should run this convolution, else the reason it does not."""
    if dtype not in (DType.F16, DType.BF16):
        return f"dtype {dtype.value} (cuDNN convolution here takes fp16/bf16)"
    if groups != 1:
        return f"{groups} groups"
    top, bottom, left, right = padding
    if top != bottom or left != right:
        return f"asymmetric padding {padding}"
    return ""


class CudnnConv(GraphStep):
    """One `conv2d` node on cuDNN: the shared graph of its problem and the node's own variant pack."""

    def __init__(
        self,
        ctx: CudnnContext,
        dtype: DType,
        x_shape: tuple[int, int, int, int],
        w_shape: tuple[int, int, int, int],
        y_shape: tuple[int, int, int, int],
        x: int,
        w: int,
        y: int,
        padding: tuple[int, int],
        stride: tuple[int, int],
        dilation: tuple[int, int],
    ) -> None:
        key = ("conv", dtype, x_shape, w_shape, padding, stride, dilation)

        def build(limit: int | None) -> Any:
            cudnn = ctx.lib
            dt = cudnn.data_type.BFLOAT16 if dtype == DType.BF16 else cudnn.data_type.HALF
            fp32 = cudnn.data_type.FLOAT
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=fp32, compute_data_type=fp32, handle=ctx.handle)

            def nchw(name: str, dims: tuple[int, int, int, int]) -> Any:
                n, c, h, wd = dims
                strides = [c * h * wd, h * wd, wd, 1]
                return g.tensor(name=name, dim=[n, c, h, wd], stride=strides, data_type=dt, uid=UIDS[name])

            tx, tw = nchw("x", x_shape), nchw("w", w_shape)
            out = g.conv_fprop(
                image=tx, weight=tw, padding=list(padding), stride=list(stride), dilation=list(dilation),
                compute_data_type=fp32,
            )  # fmt: skip
            n, o, ho, wo = y_shape
            out.set_output(True).set_dim([n, o, ho, wo]).set_stride([o * ho * wo, ho * wo, wo, 1]).set_data_type(dt)
            out.set_uid(UIDS["y"])
            finish_graph(cudnn, g, limit)
            return g

        self.key = key
        self.bind(ctx, key, build, {"x": x, "w": w, "y": y})
