"""Write the embedded default checkpoint: a tiny SD-Turbo in diffusers layout, random weights, with a TAESD.

Usage:  python dif-frontend-sdturbo/scripts/make_default_checkpoint.py [OUT_DIR]
Default OUT_DIR is the package's `default/` folder.

Reproducible with numpy and dif only (no torch): tensor names and shapes come from dif's own program
builders, stored as diffusers / transformers saves hold them (fp16, as sd-turbo's fp16 variant; the
VAE's unused encoder half left out), each tensor drawn from PCG64 seeded by a CRC of its name. The
architecture is SD-Turbo's at toy widths: the published scheduler config, 3 UNet levels with
cross-attention and per-block head counts, linear projections, a GELU CLIP text encoder, a 4-level
VAE (8x) and a TAESD. The tokenizer is a real CLIP-style BPE (byte alphabet, "</w>" word ends,
<|startoftext|> / <|endoftext|>, pad "!") whose few hundred merges are learned here from a fixed
word list, so the vocabulary is small enough for a tiny embedding table.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dif.serialize.diftensor import save_tensors
from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight, write_diffusers_folder
from dif_frontend_sdturbo.config import ClipTextConfig, TaesdConfig, UNetConfig, VaeConfig
from dif_frontend_sdturbo.taesd import build_taesd_decoder
from dif_frontend_sdturbo.text_encoder import build_text_encoder
from dif_frontend_sdturbo.unet import build_unet
from dif_frontend_sdturbo.vae import build_vae_decoder

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "src" / "dif_frontend_sdturbo"
DEFAULT_OUT = PACKAGE / "default"
PUBLISHED = PACKAGE / "configs" / "sd-turbo"
STORE = np.float16
VERSION = "0.42.1"
MERGES = 400

CORPUS = """a an the of and in on with at by for from to is are photo painting portrait of cat dog fox owl horse
bird fish tree forest mountain river lake sea ocean beach city street house castle tower bridge sky
cloud sun moon star night day morning evening winter summer autumn spring snow rain fog light dark
red orange yellow green blue purple pink white black gray golden silver small large old young happy
sitting standing running flying sleeping walking astronaut robot dragon knight wizard girl boy man
woman cinematic detailed realistic beautiful highly digital art oil watercolor sketch render
lighting studio hdr 4k 8k sharp focus bokeh landscape close up wide angle view scene style fantasy
science fiction"""
WORDS = CORPUS.split()

MODEL_INDEX = {
    "_class_name": "StableDiffusionPipeline",
    "_diffusers_version": VERSION,
    "_name_or_path": "dif/sd-turbo-tiny",
    "feature_extractor": [None, None],
    "image_encoder": [None, None],
    "requires_safety_checker": False,
    "safety_checker": [None, None],
    "scheduler": ["diffusers", "EulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}
UNET = {
    "block_out_channels": [32, 64, 64],
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "attention_head_dim": [2, 4, 4],
    "cross_attention_dim": 32,
    "norm_num_groups": 8,
    "sample_size": 32,  # 32 latent pixels: dif's default size for this checkpoint is 256
}
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
VAE = {"block_out_channels": [16, 32, 32, 32], "layers_per_block": 1, "norm_num_groups": 8, "sample_size": 256}
TAESD = {"decoder_block_out_channels": [16, 16, 16, 16], "encoder_block_out_channels": [16, 16, 16, 16]}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP's reversible byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = list(keep), 0
    for byte in range(256):
        if byte not in keep:
            keep.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


def learn_bpe(words: list[str], merges: int) -> list[tuple[str, str]]:
    """Greedy BPE merges over `words` (each a sequence of byte characters, "</w>" on the last one);
    ties broken by the pair's text, so the result does not depend on dict order."""
    table = bytes_to_unicode()
    seqs = collections.Counter(tuple(table[b] for b in w.encode()) for w in words)
    seqs = collections.Counter({(*s[:-1], s[-1] + "</w>"): n for s, n in seqs.items()})
    out: list[tuple[str, str]] = []
    for _ in range(merges):
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for s, n in seqs.items():
            for a, b in zip(s, s[1:], strict=False):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        out.append(best)
        merged: collections.Counter[tuple[str, ...]] = collections.Counter()
        for s, n in seqs.items():
            new, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    new.append(s[i] + s[i + 1])
                    i += 2
                else:
                    new.append(s[i])
                    i += 1
            merged[tuple(new)] += n
        seqs = merged
    return out


def write_tokenizer(folder: Path) -> int:
    """vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json of the tiny CLIP BPE; returns its size."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    merges = learn_bpe(WORDS * 2 + [w + w for w in WORDS[:40]], MERGES)
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    ids = {tok: i for i, tok in enumerate(dict.fromkeys(vocab))}
    (folder / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "!",
               "unk_token": "<|endoftext|>"}  # fmt: skip
    config = {**special, "model_max_length": 77, "do_lower_case": True, "tokenizer_class": "CLIPTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return len(ids)


def tensor_for(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A reproducible random tensor whose scale suits its role; stored fp16."""
    rng = name_rng(name)
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name and leaf == "weight":
        arr = 1.0 + 0.1 * rng.standard_normal(shape)
    elif leaf == "bias":
        arr = 0.1 * rng.standard_normal(shape)
    elif name.endswith(("token_embedding.weight", "position_embedding.weight")):
        arr = rng.standard_normal(shape)
    else:
        arr = random_weight(rng, name, shape)
    return arr.astype(np.float32).astype(STORE)


def published(sub: str, file: str = "config.json") -> dict:
    data = json.loads((PUBLISHED / sub / file).read_text())
    data.pop("_name_or_path", None)
    return data


def make(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        vocab_size = write_tokenizer(Path(tmp) / "tokenizer")
        unet_cfg = {**published("unet"), **UNET, "_diffusers_version": VERSION}
        text_cfg = {**published("text_encoder"), **TEXT, "vocab_size": vocab_size, "torch_dtype": "float16"}
        vae_cfg = {**published("vae"), **VAE, "_diffusers_version": VERSION}
        scheduler = {**published("scheduler", "scheduler_config.json"), "_diffusers_version": VERSION}
        unet = param_shapes(build_unet(UNetConfig.from_dict(unet_cfg), latent_h=8, latent_w=8, text_len=4))
        text = param_shapes(build_text_encoder(ClipTextConfig.from_dict(text_cfg), seq_len=4))
        vae = param_shapes(build_vae_decoder(VaeConfig.from_dict(vae_cfg), latent_h=2, latent_w=2))
        components = {"unet": (unet_cfg, unet), "text_encoder": (text_cfg, text), "vae": (vae_cfg, vae)}
        line = write_diffusers_folder(
            out, MODEL_INDEX, components, tensor_for, scheduler=scheduler, tokenizer=Path(tmp) / "tokenizer",
            tokenizer_files=("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"),
        )  # fmt: skip
    taesd_cfg = {**json.loads((PACKAGE / "configs" / "taesd" / "config.json").read_text()), **TAESD}
    shapes = param_shapes(build_taesd_decoder(TaesdConfig.from_dict(taesd_cfg), latent_h=2, latent_w=2))
    (out / "taesd").mkdir()
    (out / "taesd" / "config.json").write_text(json.dumps(taesd_cfg, indent=2) + "\n")
    tensors = {n: tensor_for(n, s) for n, s in sorted(shapes.items())}
    save_tensors(out / "taesd" / "diffusion_pytorch_model.safetensors", tensors, {"format": "pt"}, dif_metadata=False)
    print(line + f"; taesd {sum(t.nbytes for t in tensors.values()) / 1e6:.2f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    make(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
