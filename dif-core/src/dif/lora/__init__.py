"""LoRA adapters: read the dialects users have (`dif.lora.file`), recognise another family's
(`dif.lora.families`), merge them into a checkpoint's weights before binding (`dif.lora.merge`).

Where it sits: a frontend opens its checkpoint, then `merge_loras(source, specs, table, ...)`
returns the source with the adapters folded in; `bind_weights` and the backends see plain weights.
Unmerged: programs built inside `lora_slots(...)` (`dif.lora.slots`) take the adapters as inputs
(`adapter_inputs`, `dif.lora.unmerged`), so LoRAs and scales swap without preparing again. Which of
the two a pipeline runs is decided and recorded by `apply_loras` (`dif.lora.mode`).
"""

from dif.lora.families import families_of, family_label
from dif.lora.file import Adapter, LoraFile, LoraSpec, read_lora
from dif.lora.merge import (
    AppliedLora,
    LoraMergedSource,
    ModuleTable,
    Patch,
    Target,
    adapter_delta,
    match_loras,
    merge_loras,
)
from dif.lora.mode import DEFAULT_SLOT_RANK, MODES, LoraApplication, LoraMode, apply_loras, decide_lora_mode
from dif.lora.slots import current_slots, lora_slots, slot_inputs
from dif.lora.unmerged import UnmergedLoras, adapter_inputs, fill_slots, slot_ranks

__all__ = [
    "DEFAULT_SLOT_RANK",
    "MODES",
    "Adapter",
    "AppliedLora",
    "LoraApplication",
    "LoraFile",
    "LoraMergedSource",
    "LoraMode",
    "LoraSpec",
    "ModuleTable",
    "Patch",
    "Target",
    "UnmergedLoras",
    "adapter_delta",
    "adapter_inputs",
    "apply_loras",
    "current_slots",
    "decide_lora_mode",
    "families_of",
    "fill_slots",
    "family_label",
    "lora_slots",
    "match_loras",
    "merge_loras",
    "read_lora",
    "slot_inputs",
    "slot_ranks",
]
