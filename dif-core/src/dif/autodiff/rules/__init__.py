"""VJP rules of the core opset, one module per `dif.ops` module (importing registers them)."""

from dif.autodiff.rules import attention, conv, elementwise, fused, layout, linalg, norm, reduce  # noqa: F401
