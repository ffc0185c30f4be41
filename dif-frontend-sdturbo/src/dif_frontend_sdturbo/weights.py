"""SD-Turbo checkpoint access: a diffusers folder (or component single files) and a TAESD, opened and bound.

Frontend stage between the builders and a backend's `prepare`. Program parameters carry the
diffusers / transformers state-dict names, so binding is by identity, except that
  - single component files may carry a `model.diffusion_model.` / `diffusion_model.` / `model.` prefix;
  - the original TAESD decoder files (madebyollin's `taesd_decoder.safetensors`) number the layers from
    1 (their Sequential starts with a Clamp module): `decoder.layers.k` is their `k+1`;
  - the VAE's encoder half and the text encoder's `position_ids` buffer / projection are not read.
Every mismatch is reported by `dif.weights.bind_weights` naming the tensor and its file.
A TAESD is checked against the model before anything runs: its latent channels must be the UNet's,
and one made for SDXL's latent space (taesdxl) is refused with an SD 1.x / 2.x model.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
from attrs import frozen

from dif.checkpoint import read_json_object
from dif.errors import CheckpointError, ConfigError
from dif.ir.program import Program
from dif.weights import BoundWeights, MappedSource, Rule, TensorSource, bind_weights, open_component, open_safetensors
from dif.weights.metadata import file_metadata
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT
from dif_frontend_sdturbo import taesd as taesd_module
from dif_frontend_sdturbo import vae as vae_module
from dif_frontend_sdturbo.config import SdConfigs, TaesdConfig, is_sd_folder, load_configs
from dif_frontend_sdturbo.single_file import is_ldm_file

TEXT_UNUSED = (r"(text_model\.)?embeddings\.position_ids", r"text_projection\.weight")
MARKERS = {
    "unet": "conv_in.weight",
    "vae": "decoder.conv_in.weight",
    "text_encoder": "embeddings.token_embedding.weight",
    "taesd": "decoder.layers.0.weight",
}
PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.", "first_stage_model.")


@frozen
class Taesd:
    """A TAESD decoder: its config, weights (under the diffusers names) and where it came from."""

    config: TaesdConfig
    source: TensorSource
    name: str


@frozen
class SdCheckpoint:
    """One Stable Diffusion checkpoint: configs, tokenizer folder, a lazy source per component, and
    the TAESD when one was given."""

    root: Path
    name: str
    configs: SdConfigs
    tokenizer_dir: Path
    text_encoder: TensorSource
    unet: TensorSource
    vae: TensorSource
    taesd: Taesd | None = None

    @property
    def kind(self) -> str:
        return self.configs.kind

    @property
    def is_turbo(self) -> bool:
        return self.configs.kind == "turbo"


def open_single_file(path: str | Path, component: str) -> TensorSource:
    """One component as a safetensors file under the names the programs use (a common prefix such as
    `model.diffusion_model.` dropped when every tensor has it). `CheckpointError` naming the file and
    the tensor it looked for otherwise; an original (LDM) whole-checkpoint file is named as such."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such {component.replace('_', ' ')} file")
    base = open_safetensors(path)
    names = base.names()
    marker = MARKERS[component]
    if marker in base or (component == "text_encoder" and f"text_model.{marker}" in base):
        return base
    for prefix in PREFIXES:
        if names and all(n.startswith(prefix) for n in names) and f"{prefix}{marker}" in base:
            mapped = MappedSource(base, {n[len(prefix) :]: Rule(n) for n in names})
            mapped.label = f"{path} (prefix '{prefix}')"
            return mapped
    if any(n.startswith("model.diffusion_model.input_blocks.") for n in names):
        raise CheckpointError(
            f"{path}: an original (LDM / A1111) Stable Diffusion single file "
            "('model.diffusion_model.input_blocks...'); "
            "give it as the model (-m FILE), not as a component file",
            hint="dif sdturbo reads a whole original file as the model, with tokenizer/ beside it",
        )
    raise CheckpointError(
        f"{path}: not an SD {component.replace('_', ' ')} file (no '{marker}')",
        hint=f"found {len(names)} tensors, e.g. {', '.join(names[:3])}",
    )


def is_unet_file(path: Path) -> bool:
    """Whether `path` is a UNet2DCondition single file with diffusers names (headers only)."""
    if path.suffix != ".safetensors":
        return False
    try:
        source = open_single_file(path, "unet")
    except Exception:  # noqa: BLE001 - detection must not raise
        return False
    return "time_embedding.linear_1.weight" in source


def is_original_file(path: Path) -> bool:
    """Whether `path` is an original (LDM) whole Stable Diffusion single file (headers only)."""
    if path.suffix != ".safetensors":
        return False
    try:
        return is_ldm_file(open_safetensors(path))
    except Exception:  # noqa: BLE001 - detection must not raise
        return False


def open_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    unet_file: str | Path | None = None,
    vae_file: str | Path | None = None,
    text_encoder_file: str | Path | None = None,
    taesd: str | Path | None = None,
) -> SdCheckpoint:
    """Open a diffusers folder (model_index.json naming StableDiffusionPipeline), or a UNet single
    file inside / beside one. Nothing is read beyond configs and headers. `variant` picks e.g.
    `*.fp16.safetensors`; `unet_file` / `vae_file` / `text_encoder_file` replace those components;
    `taesd` (a folder or a file) adds the fast decoder (`open_taesd`)."""
    given = Path(path)
    if not given.exists():
        raise CheckpointError(f"{given}: no such file or folder")
    root = given
    if given.is_file() and given.suffix == ".safetensors" and is_ldm_file(open_safetensors(given)):
        ck = open_original_file(given)
        return ck if taesd is None else attrs.evolve(ck, taesd=open_taesd(taesd, ck))
    if given.is_file():
        if unet_file is not None:
            raise CheckpointError("give the UNet file either as the model path or as --unet, not both")
        unet_file, root = given, given.parent
        if not is_sd_folder(root):
            raise CheckpointError(
                f"{given}: a UNet single file needs the Stable Diffusion diffusers folder beside it "
                "(model_index.json, text_encoder/, vae/, tokenizer/, scheduler/)",
                hint="put the file into the folder, or pass the folder as the model and the file as --unet",
            )
    elif not is_sd_folder(given):
        raise CheckpointError(
            f"{given}: not a Stable Diffusion diffusers folder (no model_index.json naming StableDiffusionPipeline)",
            hint="point at the folder holding model_index.json, unet/, text_encoder/, vae/, tokenizer/, scheduler/",
        )
    configs = load_configs(root)
    unet = open_single_file(unet_file, "unet") if unet_file else open_component(root / "unet", variant=variant)
    vae = open_single_file(vae_file, "vae") if vae_file else open_component(root / "vae", variant=variant)
    text = (
        open_single_file(text_encoder_file, "text_encoder")
        if text_encoder_file
        else open_component(root / "text_encoder", variant=variant)
    )
    name = Path(unet_file).stem if unet_file else (root.resolve().name or "sd")
    ck = SdCheckpoint(root, name, configs, root / "tokenizer", text, unet, vae)
    return ck if taesd is None else attrs.evolve(ck, taesd=open_taesd(taesd, ck))


def open_original_file(path: Path) -> SdCheckpoint:
    """An original whole-checkpoint single file (`sd_turbo.safetensors`: LDM UNet and VAE, OpenCLIP text
    tower; `single_file.open_ldm_file`). Configs: the diffusers folder beside it when there is one, else the
    packaged SD-Turbo configs (the same architecture as SD 2.x-base); "turbo" in the file name says SD-Turbo
    (1 step), otherwise an SD 2.x-base checkpoint (25 steps, CFG). The tokenizer is not in the file:
    `tokenizer/` beside it (or in the folder)."""
    from dif_frontend_sdturbo.configs import published
    from dif_frontend_sdturbo.single_file import open_ldm_file
    from dif_frontend_sdturbo.unet import build_unet
    from dif_frontend_sdturbo.vae import build_vae_decoder

    folder = path.parent if is_sd_folder(path.parent) else None
    configs = load_configs(folder or published("sd-turbo"))
    if folder is None:
        configs = attrs.evolve(configs, kind="turbo" if "turbo" in path.name.lower() else "base")
    tokenizer = path.parent / "tokenizer"
    if not ((tokenizer / "vocab.json").is_file() or (tokenizer / "tokenizer.json").is_file()):
        raise CheckpointError(
            f"{path}: a single file holds no tokenizer, and {tokenizer} has no CLIP tokenizer files",
            hint="put the checkpoint's tokenizer/ folder (vocab.json, merges.txt) beside the file",
        )
    f = configs.unet.downsample_factor
    unet = [p.name for p in build_unet(configs.unet, latent_h=f, latent_w=f, text_len=1).params]
    vae = [p.name for p in build_vae_decoder(configs.vae, latent_h=1, latent_w=1).params]
    text, unet_src, vae_src = open_ldm_file(path, unet, vae, configs.unet, configs.vae, configs.text_encoder)
    return SdCheckpoint(folder or path.parent, path.stem, configs, tokenizer, text, unet_src, vae_src)


def default_taesd(ck: SdCheckpoint) -> Path | None:
    """The TAESD used by `--fast-vae` without `--taesd`: a `taesd/` folder inside the checkpoint
    folder (the embedded checkpoint has one), else None."""
    folder = ck.root / "taesd"
    return folder if (folder / "config.json").is_file() else None


def _original_taesd(source: TensorSource, label: str) -> TensorSource:
    """madebyollin's taesd_decoder file ('1.weight', '3.conv.0.weight', ...) under diffusers names."""
    rules = {}
    for n in source.names():
        m = re.fullmatch(r"(\d+)\.(.+)", n)
        if m is None:
            raise CheckpointError(f"{label}: tensor '{n}' is not a TAESD decoder layer ('K.weight', 'K.conv.J.weight')")
        rules[f"decoder.layers.{int(m[1]) - 1}.{m[2]}"] = Rule(n)
    mapped = MappedSource(source, rules, keep_unmapped=False)
    mapped.label = f"{label} (original TAESD decoder naming)"
    return mapped


def _sdxl_named(*names: str) -> str | None:
    for n in names:
        low = n.lower()
        if "taesdxl" in low or "sdxl" in low:
            return n
    return None


def open_taesd(path: str | Path, ck: SdCheckpoint) -> Taesd:
    """A TAESD for `ck`: a diffusers AutoencoderTiny folder (config.json + weights), or a safetensors
    file (diffusers names, or the original `taesd_decoder` naming) read with the published taesd
    config. Refused, naming the file: a latent-channel count other than the UNet's (TAESD3 / TAEF1
    are 16-channel), and a TAESD for SDXL (taesdxl: same shapes, another latent space) with this
    SD 1.x / 2.x model."""
    from dif_frontend_sdturbo.configs import taesd_config

    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such TAESD file or folder")
    names = [p.name, p.resolve().parent.name if p.is_file() else p.resolve().name]
    if p.is_dir():
        config_file = p / "config.json"
        data = read_json_object(config_file)
        names.append(str(data.get("_name_or_path", "")))
        source: TensorSource = open_component(p)
    else:
        config_file = taesd_config()
        data = read_json_object(config_file)
        meta = file_metadata(p)
        names.extend(str(v) for v in meta.values() if isinstance(v, str) and len(v) < 200)
        source = open_safetensors(p)
        if MARKERS["taesd"] not in source:
            original = "1.weight" in source  # madebyollin's own decoder file
            source = _original_taesd(source, str(p)) if original else open_single_file(p, "taesd")
        # the published config is madebyollin/taesd's (64 wide): a file of another width says its own
        width = source.info("decoder.layers.0.weight").shape[0] if "decoder.layers.0.weight" in source else None
        if width is not None:
            data = {**data, "decoder_block_out_channels": [width] * len(data["decoder_block_out_channels"])}
    cfg = TaesdConfig.from_dict(data, str(config_file))
    sdxl = _sdxl_named(*names)
    if sdxl is not None:
        raise CheckpointError(
            f"{p}: a TAESD for SDXL ('{sdxl}') cannot decode {ck.name}'s SD 1.x / 2.x latents "
            "(same shapes, another latent space: the image would be garbage)",
            hint="use madebyollin/taesd (for SD 1.x / 2.x and SD-Turbo)",
        )
    want = ck.configs.unet.out_channels
    if cfg.latent_channels != want:
        raise ConfigError(
            f"{p}: a {cfg.latent_channels}-channel TAESD (TAESD3 / TAEF1 style) for a model with "
            f"{want} latent channels",
            hint="use madebyollin/taesd (4 channels) with SD-Turbo",
        )
    if cfg.scale_factor != ck.configs.vae.scale_factor:
        raise ConfigError(f"{p}: the TAESD upsamples {cfg.scale_factor}x but the VAE {ck.configs.vae.scale_factor}x")
    return Taesd(cfg, source, p.stem if p.is_file() else p.resolve().name)


def text_prefix(source: TensorSource) -> str:
    """How the text encoder's tensors are named: "text_model." (transformers 4.x saves, sd-turbo's) or
    "" (transformers 5 saves CLIPTextModel without it)."""
    for prefix in ("text_model.", ""):
        if f"{prefix}embeddings.token_embedding.weight" in source:
            return prefix
    raise CheckpointError(
        f"{source.label}: no 'text_model.embeddings.token_embedding.weight': not a CLIP text encoder",
        hint="the text_encoder folder must hold a CLIPTextModel checkpoint",
    )


def bind_text_encoder(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_text_encoder` program (parameters are named `text_model.*`; either saved naming
    binds). The position_ids buffer and a projection head are not read; layers past the program's
    depth are reported as unexpected."""
    prefix = text_prefix(source)
    return bind_weights(program, source, lambda p: prefix + p.removeprefix("text_model."), ignore=TEXT_UNUSED)


def bind_unet(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_unet` program: every checkpoint tensor must be used."""
    return bind_weights(program, source)


def bind_vae(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_vae_decoder` program (the encoder half and quant_conv are not read)."""
    return bind_weights(program, source, ignore=vae_module.UNUSED)


def bind_taesd(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_taesd_decoder` program (a diffusers AutoencoderTiny's encoder half is not read)."""
    return bind_weights(program, source, ignore=taesd_module.UNUSED)


def embedded_checkpoint() -> Path:
    """The embedded tiny checkpoint's folder."""
    return DEFAULT_CHECKPOINT
