"""LoRA adapters: read the dialects users have (`dif.lora.file`), recognise another family's
(`dif.lora.families`), merge them into a checkpoint's weights before binding (`dif.lora.merge`).

Where it sits: a frontend opens its checkpoint, then `merge_loras(source, specs, table, ...)`
returns the source with the adapters folded in; `bind_weights` and the backends see plain weights.
"""

from dif.lora.families import families_of, family_label
from dif.lora.file import Adapter, LoraFile, LoraSpec, read_lora
from dif.lora.merge import AppliedLora, LoraMergedSource, ModuleTable, Target, adapter_delta, merge_loras

__all__ = [
    "Adapter",
    "AppliedLora",
    "LoraFile",
    "LoraMergedSource",
    "LoraSpec",
    "ModuleTable",
    "Target",
    "adapter_delta",
    "families_of",
    "family_label",
    "merge_loras",
    "read_lora",
]
