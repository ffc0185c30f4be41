"""CLIP text encoder (transformers' CLIPTextModel, the OpenCLIP ViT-H/14 text tower for SD 2.x / SD-Turbo)
as one DiffIR program: token ids -> the conditioning the UNet attends to.

Frontend stage "encode". token + learned position embeddings; pre-LN blocks
  x = x + out_proj(sdpa_causal(q, k, v)(layer_norm1 x));  x = x + fc2(act(fc1(layer_norm2 x)))
with act exact GELU (OpenCLIP) or quick GELU x*sigmoid(1.702x) (OpenAI CLIP, SD 1.x); then
`final_layer_norm`: `last_hidden_state`, which StableDiffusionPipeline passes to the UNet. SD 2.x
checkpoints store 23 of OpenCLIP's 24 layers, so this output is OpenCLIP's penultimate layer.
The mask is causal only: the pipeline passes no padding mask (padding tokens' states are part of the
77-token conditioning). Names: `text_model.embeddings.token_embedding.weight`, ...
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program
from dif.layers import attention, embedding, layer_norm, linear, project_heads
from dif_frontend_sdturbo.config import ClipTextConfig

MODULE = "text_encoder"
PREFIX = "text_model"


def _mlp(b: ProgramBuilder, x: Var, name: str, cfg: ClipTextConfig) -> Var:
    h = linear(b, x, f"{name}.fc1", cfg.intermediate_size, bias=True)
    if cfg.hidden_act == "gelu":
        h = b.emit("gelu", h, approximate="none")
    else:  # quick_gelu: x * sigmoid(1.702 x)
        h = b.emit("mul", h, b.emit("sigmoid", b.emit("scalar_affine", h, scale=1.702)))
    return linear(b, h, f"{name}.fc2", cfg.hidden_size, bias=True)


def _layer(b: ProgramBuilder, x: Var, i: int, cfg: ClipTextConfig) -> Var:
    name = f"{PREFIX}.encoder.layers.{i}"
    heads, hd = cfg.num_attention_heads, cfg.head_dim
    with b.scope(module=MODULE, block=name, section="self_attn"):
        h = layer_norm(b, x, f"{name}.layer_norm1", eps=cfg.layer_norm_eps)
        q, k, v = (project_heads(b, h, f"{name}.self_attn.{p}_proj", heads, hd, bias=True) for p in "qkv")
        o = attention(b, q, k, v, causal=True)
        x = b.emit("add", x, linear(b, o, f"{name}.self_attn.out_proj", cfg.hidden_size, bias=True))
    with b.scope(module=MODULE, block=name, section="mlp"):
        h = layer_norm(b, x, f"{name}.layer_norm2", eps=cfg.layer_norm_eps)
        return b.emit("add", x, _mlp(b, h, f"{name}.mlp", cfg))


def build_text_encoder(cfg: ClipTextConfig, *, seq_len: int, batch: int = 1, dtype: DType | str = "f32") -> Program:
    """Input `input_ids` (B, seq_len) int64 -> output `last_hidden_state` (B, seq_len, hidden) in `dtype`.

    seq_len is at most max_position_embeddings (77); positions are 0..seq_len-1."""
    dt = DType(dtype)
    b = ProgramBuilder("sd_clip_text_encoder")
    b.meta.update({"family": "sdturbo", "component": "text_encoder", "dtype": dt.value, "outputs": "last_hidden_state"})
    ids = b.input("input_ids", (batch, seq_len), DType.I64)
    with b.scope(module=MODULE, block=f"{PREFIX}.embeddings", section="embed"):
        x = embedding(b, ids, f"{PREFIX}.embeddings.token_embedding", cfg.vocab_size, cfg.hidden_size, dt)
        table = b.param(
            f"{PREFIX}.embeddings.position_embedding.weight", (cfg.max_position_embeddings, cfg.hidden_size), dt
        )
        with b.scope(tensors=(table.name,)):
            pos = b.emit("slice", table, axis=0, start=0, stop=seq_len)
            x = b.emit("add", x, b.emit("reshape", pos, shape=(1, seq_len, cfg.hidden_size)))
    for i in range(cfg.num_hidden_layers):
        x = _layer(b, x, i, cfg)
    with b.scope(module=MODULE, block=f"{PREFIX}.final_layer_norm", section="norm"):
        b.output(layer_norm(b, x, f"{PREFIX}.final_layer_norm", eps=cfg.layer_norm_eps))
    return b.build()
