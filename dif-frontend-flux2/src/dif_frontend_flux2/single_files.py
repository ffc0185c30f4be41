"""FLUX.2 [klein] from single files and no diffusers folder: a transformer file, a text-encoder file,
a VAE file (safetensors or GGUF each), with configs from the files or the package's published ones.

Frontend stage, part of opening a checkpoint (`weights.open_checkpoint` calls `open_single_files`
when the transformer file has no diffusers folder beside it and no --base). Each component's config:
  1. the file's own: a JSON `config` entry in its metadata (safetensors `__metadata__` or GGUF
     key-value), or for a GGUF Qwen3 text encoder its `qwen3.*` keys (llama.cpp's);
  2. else the published config (`configs/<variant>/`, package data) of the variant whose transformer
     shapes the file has: hidden width, text width, input channels, double and single block counts.
     Weights cannot tell distilled from base (same architecture): `--config-variant klein-base-4b`
     says so; the default is the distilled variant of the matching size.
The tokenizer is the Qwen3 tokenizer every klein uses, shipped with the embedded checkpoint. Text
encoder names: transformers' (`model.layers.N...`, with or without the `model.` prefix) or
llama.cpp's GGUF names (`blk.N.attn_q.weight`, `token_embd.weight`, ...).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from dif.errors import CheckpointError, ConfigError
from dif.weights import MappedSource, Rule, TensorSource, open_safetensors
from dif.weights.fp8 import scaled_fp8
from dif.weights.gguf import GGUFFile, is_gguf, open_gguf
from dif.weights.metadata import embedded_config
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Flux2Configs, Flux2TransformerConfig, Flux2VaeConfig, Qwen3Config, load_configs
from dif_frontend_flux2.configs import published

DISTILLED_VARIANTS = ("klein-4b", "klein-9b")
TOKENIZER_DIR = DEFAULT_CHECKPOINT / "tokenizer"

# llama.cpp GGUF names of a Qwen3 decoder layer -> transformers names
_GGUF_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
_GGUF_TOP["output.weight"] = "lm_head.weight"


def transformer_shape(source: TensorSource) -> dict[str, int]:
    """What a transformer's tensors say of its architecture (diffusers names)."""
    names = source.names()

    def count(pattern: str) -> int:
        return len({m[1] for n in names if (m := re.match(pattern, n))})

    for needed in ("x_embedder.weight", "context_embedder.weight"):
        if needed not in source:
            raise CheckpointError(f"{source.label}: no '{needed}': not a FLUX.2 transformer")
    inner, in_channels = source.info("x_embedder.weight").shape
    return {
        "inner_dim": inner,
        "in_channels": in_channels,
        "joint_attention_dim": source.info("context_embedder.weight").shape[1],
        "num_layers": count(r"transformer_blocks\.(\d+)\."),
        "num_single_layers": count(r"single_transformer_blocks\.(\d+)\."),
    }


def _shape_of(cfg: Flux2TransformerConfig) -> dict[str, int]:
    return {
        "inner_dim": cfg.inner_dim,
        "in_channels": cfg.in_channels,
        "joint_attention_dim": cfg.joint_attention_dim,
        "num_layers": cfg.num_layers,
        "num_single_layers": cfg.num_single_layers,
    }


def infer_variant(source: TensorSource, requested: str | None = None) -> str:
    """The published variant whose transformer has these shapes (`requested` if given and it fits)."""
    shape = transformer_shape(source)
    candidates = (requested,) if requested else DISTILLED_VARIANTS
    for variant in candidates:
        if _shape_of(load_configs(published(variant)).transformer) == shape:
            return variant
    said = ", ".join(f"{k}={v}" for k, v in shape.items())
    if requested:
        want = ", ".join(f"{k}={v}" for k, v in _shape_of(load_configs(published(requested)).transformer).items())
        raise CheckpointError(
            f"{source.label}: the transformer ({said}) is not FLUX.2 [{requested}] ({want})",
            hint="drop --config-variant to infer it, or give the matching variant",
        )
    raise CheckpointError(
        f"{source.label}: the transformer ({said}) matches no published FLUX.2 [klein] variant and the file "
        "carries no config",
        hint="pass --base FOLDER (a diffusers folder of this model) or use a file with a 'config' in its metadata",
    )


def open_text_encoder_file(path: str | Path) -> tuple[TensorSource, dict[str, Any] | None]:
    """A Qwen3 text encoder single file under transformers names, and its own config if it has one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such text encoder file")
    if is_gguf(path):
        gguf = open_gguf(path)
        arch = gguf.architecture
        if arch not in (None, "qwen3"):
            raise CheckpointError(f"{path}: a GGUF of architecture {arch!r}; FLUX.2 [klein] uses a Qwen3 text encoder")
        rules: dict[str, Rule] = {}
        for name in gguf.names():
            m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
            if m and m[2] in _GGUF_LAYER:
                rules[f"model.layers.{m[1]}.{_GGUF_LAYER[m[2]]}.{m[3]}"] = Rule(name)
            elif name in _GGUF_TOP:
                rules[_GGUF_TOP[name]] = Rule(name)
        mapped = MappedSource(gguf, rules)
        mapped.label = f"{path} (llama.cpp GGUF names)"
        return mapped, _gguf_qwen3_config(gguf) if arch == "qwen3" else embedded_config(path)
    source = scaled_fp8(open_safetensors(path))
    if "model.embed_tokens.weight" not in source and "embed_tokens.weight" in source:  # a Qwen3Model save
        mapped = MappedSource(source, {f"model.{n}": Rule(n) for n in source.names()})
        mapped.label = source.label
        return mapped, embedded_config(path)
    if "model.embed_tokens.weight" not in source:
        raise CheckpointError(
            f"{path}: not a Qwen3 text encoder (no 'model.embed_tokens.weight')",
            hint=f"found {len(source)} tensors, e.g. {', '.join(source.names()[:3])}",
        )
    return source, embedded_config(path)


def _gguf_qwen3_config(gguf: GGUFFile) -> dict[str, Any]:
    """A transformers-style Qwen3 config from llama.cpp's `qwen3.*` metadata and the tensor shapes."""
    m = gguf.metadata

    def key(name: str) -> Any:
        value = m.get(f"qwen3.{name}")
        if value is None:
            raise ConfigError(f"{gguf.path}: GGUF metadata 'qwen3.{name}' is missing")
        return value

    heads = key("attention.head_count")
    vocab = gguf.info("token_embd.weight").shape[0] if "token_embd.weight" in gguf else len(m["tokenizer.ggml.tokens"])
    return {
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": m.get("qwen3.attention.head_count_kv", heads),
        "head_dim": m.get("qwen3.attention.key_length", key("embedding_length") // heads),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "rope_theta": m.get("qwen3.rope.freq_base", 1_000_000.0),
        "tie_word_embeddings": "output.weight" not in gguf,
    }


def open_single_files(
    transformer: TensorSource,
    transformer_file: Path,
    *,
    text_encoder_file: Path | None,
    vae: TensorSource | None,
    vae_file: Path | None,
    config_variant: str | None = None,
) -> tuple[Path, Flux2Configs, TensorSource, Path, str]:
    """(configs root, configs, text encoder source, tokenizer folder, variant) for a transformer file
    with no diffusers folder: its text encoder and VAE must be single files too."""
    missing = [
        flag for flag, given in (("--text-encoder FILE", text_encoder_file), ("--vae FILE", vae_file)) if not given
    ]
    if missing:
        raise CheckpointError(
            f"{transformer_file}: a transformer single file with no diffusers folder beside it needs "
            f"{' and '.join(missing)}",
            hint="give the text encoder (Qwen3 safetensors or GGUF) and the VAE as single files, "
            "or a diffusers folder of the same model with --base FOLDER",
        )
    assert text_encoder_file is not None and vae_file is not None and vae is not None
    own = embedded_config(transformer_file)
    variant = config_variant or (None if own else infer_variant(transformer, config_variant))
    root = published(variant or DISTILLED_VARIANTS[0])
    configs = load_configs(root)
    if own is not None:
        configs = attrs.evolve(configs, transformer=Flux2TransformerConfig.from_dict(own))
    elif config_variant:
        infer_variant(transformer, config_variant)  # the requested variant must fit the file
    text, text_config = open_text_encoder_file(text_encoder_file)
    if text_config is not None:
        configs = attrs.evolve(configs, text_encoder=Qwen3Config.from_dict(text_config))
    vae_config = embedded_config(vae_file)
    if vae_config is not None:
        configs = attrs.evolve(configs, vae=Flux2VaeConfig.from_dict(vae_config))
    taps = 3 * configs.text_encoder.hidden_size
    if taps != configs.transformer.joint_attention_dim:
        raise CheckpointError(
            f"{text_encoder_file}: the text encoder (hidden size {configs.text_encoder.hidden_size}, 3 taps = {taps}) "
            f"does not fit the transformer of {transformer_file} (joint_attention_dim "
            f"{configs.transformer.joint_attention_dim})",
            hint="klein 4B uses Qwen3-4B, klein 9B Qwen3-8B",
        )
    return root, configs, text, TOKENIZER_DIR, variant or "(the files' own configs)"
