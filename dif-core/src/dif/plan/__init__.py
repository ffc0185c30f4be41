"""Planning: schedule, buffer lifetimes, arena offsets, weight residency, the streaming schedule, node
placement and binding (after the optimizer, before a backend's `prepare`). See `plan.py` (data),
`planner.py`, `streaming.py`, `placement.py`, `views.py`, `difplan.py` (file)."""

from dif.plan.difplan import BindingMismatch, check_binding, load_plan, plan_from_bytes, plan_to_bytes, save_plan
from dif.plan.placement import DEVICE, HOST
from dif.plan.plan import Binding, Buffer, Decision, Plan, check_arena, check_plan, compiler_revision
from dif.plan.planner import plan_program, restream
from dif.plan.streaming import StreamBlock, Streaming

__all__ = [
    "Binding",
    "BindingMismatch",
    "Buffer",
    "DEVICE",
    "Decision",
    "HOST",
    "Plan",
    "check_arena",
    "check_binding",
    "check_plan",
    "compiler_revision",
    "load_plan",
    "plan_from_bytes",
    "plan_program",
    "plan_to_bytes",
    "restream",
    "save_plan",
    "StreamBlock",
    "Streaming",
]
