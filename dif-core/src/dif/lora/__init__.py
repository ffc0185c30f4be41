"""LoRA adapters: read the dialects users have (`dif.lora.file`), recognise another family's
(`dif.lora.families`), merge them into a checkpoint's weights before binding (`dif.lora.merge`).

Where it sits: a frontend opens its checkpoint, then `merge_loras(source, specs, table, ...)`
returns the source with the adapters folded in; `bind_weights` and the backends see plain weights.
Unmerged: programs built inside `lora_slots(...)` (`dif.lora.slots`) take the adapters as inputs
(`adapter_inputs`, `dif.lora.unmerged`), so LoRAs and scales swap without preparing again. Which of
the two a pipeline runs is decided and recorded by `apply_loras` (`dif.lora.mode`). A file's
text-encoder adapters (`apply_loras(..., text_encoder=LoraComponent(...))`, tables from
`text_encoder_table`) are merged in either mode.
"""

from dif.lora.families import families_of, family_label
from dif.lora.file import Adapter, LoraFile, LoraSpec, read_lora
from dif.lora.merge import (
    AppliedLora,
    LoraComponent,
    LoraMergedSource,
    ModuleTable,
    Patch,
    Target,
    adapter_delta,
    match_lora_parts,
    match_loras,
    merge_loras,
    text_encoder_table,
)
from dif.lora.mode import (
    DEFAULT_SLOT_RANK,
    MODES,
    TEXT_ENCODER_WHY,
    LoraApplication,
    LoraMode,
    apply_loras,
    decide_lora_mode,
)
from dif.lora.slots import current_slots, lora_slots, slot_inputs
from dif.lora.unmerged import UnmergedLoras, adapter_inputs, fill_slots, slot_ranks

__all__ = [
    "DEFAULT_SLOT_RANK",
    "MODES",
    "TEXT_ENCODER_WHY",
    "Adapter",
    "AppliedLora",
    "LoraApplication",
    "LoraComponent",
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
    "match_lora_parts",
    "match_loras",
    "merge_loras",
    "read_lora",
    "slot_inputs",
    "slot_ranks",
    "text_encoder_table",
]
