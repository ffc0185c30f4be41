"""Full-size FLUX.2 [klein] architectures from the published configs: the programs' parameter names
and shapes equal the diffusers/transformers state dicts (built on the meta device, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dif.ir.program import Program
from dif_frontend_flux2.config import load_configs
from dif_frontend_flux2.model import build_transformer
from dif_frontend_flux2.text_encoder import KLEIN_TAPS, build_text_encoder
from dif_frontend_flux2.vae import build_vae_decoder, build_vae_encoder

# Published parameter counts (transformer per variant, VAE of every variant), counted from the configs on
# the meta device with diffusers 0.42.1; provenance in dif_frontend_flux2/configs/SOURCES.md.
VARIANTS = {"klein-9b": 9_078_581_248, "klein-4b": 3_875_544_576}
VAE_PARAMS = 84_046_115


def _shapes(program: Program) -> dict[str, tuple[int, ...]]:
    return {p.name: p.type.shape for p in program.params}


def _state_shapes(module) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _config_dict(path: Path) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_param_counts_match_published(model_configs, variant):  # type: ignore[no-untyped-def]
    cfgs = load_configs(model_configs(variant))
    prog = build_transformer(cfgs.transformer, batch=1, n_img=4, n_txt=3, dtype="bf16")
    assert prog.param_count() == VARIANTS[variant]
    dec = build_vae_decoder(cfgs.vae, batch=1, latent_h=2, latent_w=2)
    enc = build_vae_encoder(cfgs.vae, batch=1, height=16, width=16)
    assert dec.param_count() + enc.param_count() == VAE_PARAMS  # bn buffers are not parameters
    assert cfgs.pipeline.is_distilled is True
    assert load_configs(model_configs(variant.replace("klein-", "klein-base-"))).pipeline.is_distilled is False


@pytest.mark.oracle
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_transformer_params_equal_diffusers(torch, model_configs, variant):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="needs diffusers")
    cfg_path = model_configs(variant) / "transformer" / "config.json"
    with torch.device("meta"):
        ref = diffusers.Flux2Transformer2DModel.from_config(_config_dict(cfg_path))
    prog = build_transformer(load_configs(model_configs(variant)).transformer, batch=1, n_img=4, n_txt=3)
    assert _shapes(prog) == _state_shapes(ref)
    assert prog.param_count() == VARIANTS[variant]


@pytest.mark.oracle
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_text_encoder_params_are_the_truncated_state_dict(torch, model_configs, variant):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    config = transformers.Qwen3Config.from_json_file(str(model_configs(variant) / "text_encoder" / "config.json"))
    with torch.device("meta"):
        ref = transformers.Qwen3ForCausalLM(config)
    cfg = load_configs(model_configs(variant)).text_encoder
    prog = build_text_encoder(cfg, batch=1, seq_len=4, dtype="bf16")
    n = max(KLEIN_TAPS)
    needed = {
        k: s
        for k, s in _state_shapes(ref).items()
        if k.startswith("model.embed_tokens.") or (k.startswith("model.layers.") and int(k.split(".")[2]) < n)
    }
    assert _shapes(prog) == needed
    assert not any(k.startswith(f"model.layers.{n}.") for k in _shapes(prog))


@pytest.mark.oracle
def test_vae_params_equal_diffusers(torch, model_configs):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="needs diffusers")
    cfg_path = model_configs("klein-9b") / "vae" / "config.json"
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLFlux2.from_config(_config_dict(cfg_path))
    state = _state_shapes(ref)
    cfg = load_configs(model_configs("klein-9b")).vae
    bn = {k: state[k] for k in ("bn.running_mean", "bn.running_var")}

    dec = build_vae_decoder(cfg, batch=1, latent_h=2, latent_w=2, from_packed=True)
    expected = {k: s for k, s in state.items() if k.startswith(("decoder.", "post_quant_conv."))}
    assert _shapes(dec) == {**expected, **bn}
    enc = build_vae_encoder(cfg, batch=1, height=16, width=16, to_packed=True)
    expected_enc = {k: s for k, s in state.items() if k.startswith(("encoder.", "quant_conv."))}
    assert _shapes(enc) == {**expected_enc, **bn}
    assert set(state) == set(_shapes(dec)) | set(_shapes(enc)) | {"bn.num_batches_tracked"}


# -- config parsing: the published files, and clear errors for bad ones ---------------------------


def test_published_configs_parse(model_configs):  # type: ignore[no-untyped-def]
    cfgs = load_configs(model_configs("klein-4b"))
    assert (cfgs.transformer.inner_dim, cfgs.transformer.mlp_hidden, cfgs.transformer.out_dim) == (3072, 9216, 128)
    assert cfgs.text_encoder.hidden_size * len(KLEIN_TAPS) == cfgs.transformer.joint_attention_dim
    assert cfgs.text_encoder.rope_theta == 1e6 and cfgs.text_encoder.tie_word_embeddings is True
    assert cfgs.vae.patched_channels == cfgs.transformer.in_channels == 128 and cfgs.vae.scale_factor == 8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer"),
        ({"axes_dims_rope": [64, 64, 64]}, "axes_dims_rope"),
        ({"patch_size": 2}, "patch_size 2 is not supported"),
        ({"brand_new_option": 1}, "unknown config keys brand_new_option"),
        ({"_class_name": "FluxTransformer2DModel"}, "expected 'Flux2Transformer2DModel'"),
    ],
)
def test_bad_transformer_config_is_a_config_error(model_configs, tmp_path, change, message):  # type: ignore[no-untyped-def]
    from dif_frontend_flux2.config import ConfigError, Flux2TransformerConfig

    data = json.loads((model_configs("klein-4b") / "transformer" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, **change}))
    with pytest.raises(ConfigError, match=message) as info:
        Flux2TransformerConfig.from_json(path)
    assert str(path) in str(info.value)


def test_qwen3_config_variants():
    from dif_frontend_flux2.config import ConfigError, Qwen3Config

    base = dict(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    cfg = Qwen3Config.from_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}})
    assert cfg.rope_theta == 500.0 and cfg.head_dim == 4  # head_dim derived when absent
    with pytest.raises(ConfigError, match="rope type 'yarn'"):
        Qwen3Config.from_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ConfigError, match="not a multiple"):
        Qwen3Config.from_dict({**base, "num_key_value_heads": 3, "num_attention_heads": 4})
    with pytest.raises(ConfigError, match="missing keys vocab_size"):
        Qwen3Config.from_dict({k: v for k, v in base.items() if k != "vocab_size"})


def test_vae_and_pipeline_config_errors(tmp_path):  # type: ignore[no-untyped-def]
    from dif_frontend_flux2.config import ConfigError, Flux2PipelineInfo, Flux2VaeConfig

    with pytest.raises(ConfigError, match="not divisible by norm_num_groups"):
        Flux2VaeConfig.from_dict({"block_out_channels": [48, 64, 64, 64]})
    with pytest.raises(ConfigError, match="component 'text_encoder' is 'T5EncoderModel'"):
        Flux2PipelineInfo.from_dict(
            {
                "_class_name": "Flux2KleinPipeline",
                "transformer": ["diffusers", "Flux2Transformer2DModel"],
                "text_encoder": ["transformers", "T5EncoderModel"],
                "vae": ["diffusers", "AutoencoderKLFlux2"],
                "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            }
        )
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="file not found"):
        Flux2VaeConfig.from_json(missing)
