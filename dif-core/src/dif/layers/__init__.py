"""Reusable DiffIR layer builders and host-side tables, shared by every frontend.

Nothing here names a model: frontends pass checkpoint names and sizes. `tables` holds numpy
constants (RoPE, sinusoids) that programs take as inputs; the other modules emit DiffIR nodes
through a `ProgramBuilder` (`causal_lm`: decoder-only text encoders in the Llama / Qwen layout).
"""

from dif.layers.attention import apply_rope, attention, head_rms_norm, project_heads, qkv_heads
from dif.layers.basic import (
    activation,
    chunk,
    conv2d,
    embedding,
    group_norm,
    layer_norm,
    linear,
    merge_heads,
    rms_norm,
    split,
    split_heads,
)
from dif.layers.causal_lm import (
    BaseDecoderConfig,
    DecoderConfig,
    DecoderLayerSpec,
    decoder_layer,
    decoder_rope_tables,
    tapped_hidden_states,
    tapped_text_encoder,
)
from dif.layers.conv_blocks import attention_block_2d, downsample_2d, norm_act_conv, resnet_block_2d, upsample_2d
from dif.layers.ffn import glu_ffn_fused, glu_ffn_split
from dif.layers.modulation import (
    gated_residual,
    modulated_layer_norm,
    modulation_chunks,
    split_tokens,
    timestep_mlp,
)
from dif.layers.tables import grid_ids, rope_half_tables, rope_pairs_tables, sinusoidal_embedding

__all__ = [
    "BaseDecoderConfig",
    "DecoderConfig",
    "DecoderLayerSpec",
    "activation",
    "apply_rope",
    "attention",
    "attention_block_2d",
    "chunk",
    "conv2d",
    "decoder_layer",
    "decoder_rope_tables",
    "downsample_2d",
    "embedding",
    "gated_residual",
    "glu_ffn_fused",
    "glu_ffn_split",
    "grid_ids",
    "group_norm",
    "head_rms_norm",
    "layer_norm",
    "linear",
    "merge_heads",
    "modulated_layer_norm",
    "modulation_chunks",
    "norm_act_conv",
    "project_heads",
    "qkv_heads",
    "resnet_block_2d",
    "rms_norm",
    "rope_half_tables",
    "rope_pairs_tables",
    "sinusoidal_embedding",
    "split",
    "split_heads",
    "split_tokens",
    "tapped_hidden_states",
    "tapped_text_encoder",
    "timestep_mlp",
    "upsample_2d",
]
