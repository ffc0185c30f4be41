"""Unmerged LoRA, step 1: which linears of a program being built get a low-rank side GEMM.

Where it sits: at build time. Inside `with lora_slots({"blk.0.attn.to_q.weight": 16, ...}):`, every
`dif.layers.basic.linear` whose weight is listed declares two program inputs, `lora.<module>.down`
[rank, in] and `lora.<module>.up` [out, rank], and adds `(x @ down^T) @ up^T` to its output. The
adapters are inputs, not weights, so a new LoRA or scale is new input values for the same prepared
program (and, on CUDA, the same captured graph); zero rows pad every slot to its rank, so any
adapter up to that rank fits. Frontend builders need no change: the slots are a context variable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

_NONE: Mapping[str, int] = MappingProxyType({})
_SLOTS: ContextVar[Mapping[str, int]] = ContextVar("dif_lora_slots", default=_NONE)


def slot_inputs(module: str) -> tuple[str, str]:
    """The (down, up) input names of the slot on `module` (a linear's name, without `.weight`)."""
    return f"lora.{module}.down", f"lora.{module}.up"


def current_slots() -> Mapping[str, int]:
    """Weight name -> rank of the slots programs built now get (empty outside `lora_slots`)."""
    return _SLOTS.get()


@contextmanager
def lora_slots(ranks: Mapping[str, int]) -> Iterator[None]:
    """Programs built inside give the linears of `ranks` (weight name -> rank) a side GEMM."""
    token = _SLOTS.set(MappingProxyType(dict(ranks)))
    try:
        yield
    finally:
        _SLOTS.reset(token)
