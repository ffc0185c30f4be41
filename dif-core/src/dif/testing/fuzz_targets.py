"""Fuzzing, step 0: every reader in dif-core that takes a file from outside, as a `FuzzTarget`.

Where it sits: `core_targets()` is what perf/fuzz.py and the fuzz tests run; frontends keep their
config readers' targets in their own tests (dif-core does not import frontends) and hand them to the
same `run_fuzz`. Each loader does what a user's command would: open the file, then touch what was read
(every tensor's bytes, an encode with the tokenizer, a render of the chat template).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dif.bench.recipe import KIND as RECIPE_KIND
from dif.bench.recipe import load_recipe
from dif.kit.scheduler import load_scheduler_config
from dif.serialize import container
from dif.serialize.difir import MAGIC, VERSION, program_from_bytes, program_to_bytes
from dif.serialize.diftensor import load_tensors, save_tensors
from dif.serialize.provenance import provenance_from_bytes, provenance_to_bytes
from dif.serialize.text import parse_program, print_program
from dif.testing.fuzz import fuzz_cases, tiny_program
from dif.testing.fuzz_run import FuzzTarget, scratch_dir, write_case
from dif.text.chat import find_chat_template
from dif.text.tokenizer import TextTokenizer
from dif.weights.source import open_index, open_safetensors

CONTAINER_MAGIC = b"FUZZMAGC"


# -- seeds ---------------------------------------------------------------------------------------
@functools.cache
def _diftensor_bytes() -> bytes:
    import ml_dtypes

    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.ones(4, ml_dtypes.bfloat16),
        "c": np.zeros(0, np.int8),
    }
    path = scratch_dir("seeds") / "seed.diftensor"
    save_tensors(path, tensors, {"note": "fuzz"})
    return path.read_bytes()


@functools.cache
def _checkpoint_bytes(names: tuple[str, ...]) -> bytes:
    """A plain safetensors file (no dif metadata) holding small tensors `names`."""
    tensors = {name: np.full((2, 4), i, np.float32) for i, name in enumerate(names)}
    path = scratch_dir("seeds") / "seed.safetensors"
    save_tensors(path, tensors, dif_metadata=False)
    return path.read_bytes()


def _safetensors_header(data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + n]


_SHARDS = {"model-00001-of-00002.safetensors": ("a.weight", "a.bias"), "model-00002-of-00002.safetensors": ("b",)}


def _index_seed() -> bytes:
    weight_map = {tensor: shard for shard, tensors in _SHARDS.items() for tensor in tensors}
    return json.dumps({"metadata": {"total_size": 96}, "weight_map": weight_map}, indent=2).encode()


def _scheduler_seeds() -> list[bytes]:
    flux2 = {
        "_class_name": "FlowMatchEulerDiscreteScheduler",
        "_diffusers_version": "0.36.0",
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 4096,
        "max_shift": 1.15,
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "time_shift_type": "exponential",
        "use_dynamic_shifting": True,
        "use_karras_sigmas": False,
    }
    return [json.dumps(flux2, indent=2).encode(), json.dumps({"shift": 1.0}).encode()]


# A byte-level BPE small enough to load in a millisecond: the 256 byte symbols and a few merges.
_BPE_MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r")]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def _vocab() -> dict[str, int]:
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {symbol: i for i, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    for left, right in _BPE_MERGES:
        vocab[left + right] = len(vocab)
    return vocab


def _vocab_json() -> bytes:
    return json.dumps(_vocab(), ensure_ascii=False).encode()


def _merges_txt() -> bytes:
    return ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _BPE_MERGES)).encode()


def _tokenizer_config_seeds() -> list[bytes]:
    n = len(_vocab())
    added = {
        str(n): {"content": "<|endoftext|>", "special": True, "lstrip": False, "rstrip": False, "normalized": False},
        str(n + 1): {"content": "<|im_start|>", "special": True},
        str(n + 2): {"content": "<|im_end|>", "special": True},
    }
    full = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|extra|>"],
        "pad_token": "<|endoftext|>",
        "eos_token": {"content": "<|im_end|>"},
        "chat_template": _CHAT_TEMPLATE,
        "add_prefix_space": False,
        "model_max_length": 512,
    }
    named = {**full, "chat_template": [{"name": "default", "template": _CHAT_TEMPLATE}, {"name": "x", "template": "x"}]}
    return [json.dumps(full, indent=2).encode(), json.dumps(named).encode()]


@functools.cache
def _tokenizer_json() -> bytes:
    """tokenizer.json of the same BPE, as the `tokenizers` library serializes it."""
    folder = _tokenizer_folder("seed-tokenizer")
    return TextTokenizer.from_folder(folder).backend.to_str(pretty=True).encode()


def _tokenizer_folder(name: str) -> Path:
    """A scratch folder holding the valid vocab.json, merges.txt and tokenizer_config.json."""
    folder = scratch_dir(name)
    if not (folder / "merges.txt").is_file():
        write_case(folder, "vocab.json", _vocab_json())
        write_case(folder, "merges.txt", _merges_txt())
        write_case(folder, "tokenizer_config.json", _tokenizer_config_seeds()[0])
    return folder


def _recipe_seeds() -> list[bytes]:
    recipe = {
        "kind": RECIPE_KIND,
        "name": "fuzz",
        "description": "a chain of two stages",
        "vars": {"model": "{workdir}/model", "prompt": "a fox {{in braces}}"},
        "stages": [
            {"name": "setup", "role": "setup", "argv": ["{python}", "-c", "pass"], "produces": ["{model}"]},
            {
                "name": "dif",
                "role": "measured",
                "argv": ["{python}", "-m", "dif_tools", "-p", "{prompt}"],
                "env": {"BENCH_SAMPLE_DIR": "{recipe_dir}"},
                "timeout_s": 30,
                "depends_on": ["setup"],
                "outputs": ["{workdir}/out.png"],
                "model_files": ["{model}/*.safetensors"],
            },
        ],
    }
    return [json.dumps(recipe, indent=2).encode()]


# -- loaders -------------------------------------------------------------------------------------
def _load_tensors(data: bytes) -> None:
    tensors, _ = load_tensors(write_case(scratch_dir("diftensor"), "input.diftensor", data))
    for arr in tensors.values():
        arr.tobytes()  # touch every byte of every mapped view


def _load_safetensors_header(header: bytes) -> None:
    seed = _diftensor_bytes()
    _load_tensors(struct.pack("<Q", len(header)) + header + seed[8 + len(_safetensors_header(seed)) :])


def _load_checkpoint_file(data: bytes) -> None:
    source = open_safetensors(write_case(scratch_dir("checkpoint"), "model.safetensors", data))
    for name in source:
        source.info(name).describe()
        source[name].tobytes()


def _load_index(data: bytes) -> None:
    folder = scratch_dir("index")
    for shard, tensors in _SHARDS.items():
        if not (folder / shard).is_file():
            write_case(folder, shard, _checkpoint_bytes(tensors))
    source = open_index(write_case(folder, "model.safetensors.index.json", data))
    for name in source:
        source[name].tobytes()


def _load_program_section(section: bytes) -> None:
    sections = container.unpack(program_to_bytes(tiny_program()), MAGIC, (VERSION,), "fuzz")[1]
    program_from_bytes(container.pack(MAGIC, VERSION, {**sections, "program": section}))


def _load_scheduler(data: bytes) -> None:
    folder = scratch_dir("scheduler")
    (folder / "scheduler").mkdir(exist_ok=True)
    config = load_scheduler_config(write_case(folder / "scheduler", "scheduler_config.json", data).parent.parent)
    if config.use_dynamic_shifting:
        config.schedule(4, mu=config.mu_for(1024))
    else:
        config.schedule(4)


def _use_tokenizer(folder: Path) -> None:
    tokenizer = TextTokenizer.from_folder(folder)
    text = "hello world <|im_end|>"
    if tokenizer.chat_template is not None:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if tokenizer.pad_id is not None:
        tokenizer.encode_batch([text, ""], 16)
    tokenizer.decode(tokenizer.encode(text))


def _load_tokenizer_file(file_name: str) -> Callable[[bytes], None]:
    """A loader for one of the folder's files; the others stay valid (each target has its own folder)."""

    def load(data: bytes) -> None:
        folder = _tokenizer_folder(f"tok-{file_name}")
        write_case(folder, file_name, data)
        _use_tokenizer(folder)

    return load


def _load_tokenizer_json(data: bytes) -> None:
    folder = _tokenizer_folder("tok-tokenizer.json")
    write_case(folder, "tokenizer.json", data)
    _use_tokenizer(folder)


def _load_chat_template(data: bytes) -> None:
    folder = scratch_dir("chat-template")
    write_case(folder, "chat_template.jinja", data)
    template = find_chat_template(folder, {"bos_token": "<s>"})
    if template is not None:
        template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)


def _load_recipe(data: bytes) -> None:
    folder = scratch_dir("recipe")
    load_recipe(write_case(folder, "recipe.json", data), folder / "work", check_files=False)


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


@functools.cache
def _gguf_bytes() -> bytes:
    """A GGUF v3 file written by hand (no gguf package at run time): 3 metadata values (a string, a
    uint32, an array of strings), an F32 tensor [4, 32] and a Q8_0 tensor [2, 64], 32-byte aligned."""
    kv = _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("flux")
    kv += _gguf_string("general.alignment") + struct.pack("<II", 4, 32)
    kv += _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _gguf_string("a") + _gguf_string("b")
    f32 = np.arange(128, dtype=np.float32).tobytes()
    block = np.float16(0.5).tobytes() + np.arange(-16, 16, dtype=np.int8).tobytes()  # one Q8_0 block, 34 bytes
    q8 = block * 4
    tensors = _gguf_string("w.f32") + struct.pack("<IQQIQ", 2, 32, 4, 0, 0)
    tensors += _gguf_string("w.q8") + struct.pack("<IQQIQ", 2, 64, 2, 8, len(f32))
    head = b"GGUF" + struct.pack("<IQQ", 3, 2, 3) + kv + tensors
    head += bytes(-len(head) % 32)
    return head + f32 + q8


def _load_gguf(data: bytes) -> None:
    from dif.weights.gguf import open_gguf

    source = open_gguf(write_case(scratch_dir("gguf"), "model.gguf", data))
    for name in source.names():
        source.info(name).describe()
        np.asarray(source[name]).tobytes()


def _lora_seeds() -> list[bytes]:
    """A kohya LoRA with alpha and a LyCORIS LoKr + LoHa file, on the modules of `_LORA_BASE`."""
    rng = np.random.default_rng(0)
    kohya = {
        "lora_unet_a_proj.lora_down.weight": rng.standard_normal((2, 8)).astype(np.float32),
        "lora_unet_a_proj.lora_up.weight": rng.standard_normal((8, 2)).astype(np.float32),
        "lora_unet_a_proj.alpha": np.array(1.0, np.float32),
    }
    lycoris = {
        "lycoris_a_proj.lokr_w1": rng.standard_normal((2, 2)).astype(np.float32),
        "lycoris_a_proj.lokr_w2_a": rng.standard_normal((4, 1)).astype(np.float32),
        "lycoris_a_proj.lokr_w2_b": rng.standard_normal((1, 4)).astype(np.float32),
        "lycoris_b.hada_w1_a": rng.standard_normal((8, 2)).astype(np.float32),
        "lycoris_b.hada_w1_b": rng.standard_normal((2, 8)).astype(np.float32),
        "lycoris_b.hada_w2_a": rng.standard_normal((8, 2)).astype(np.float32),
        "lycoris_b.hada_w2_b": rng.standard_normal((2, 8)).astype(np.float32),
        "lycoris_b.alpha": np.array(2.0, np.float32),
    }
    out = []
    for i, tensors in enumerate((kohya, lycoris)):
        path = scratch_dir("seeds") / f"lora{i}.safetensors"
        save_tensors(path, tensors, dif_metadata=False)
        out.append(path.read_bytes())
    return out


def _load_lora(data: bytes) -> None:
    from dif.lora import Target, merge_loras
    from dif.weights.source import ArraySource

    base = ArraySource({"a.proj.weight": np.ones((8, 8), np.float32), "b.weight": np.ones((8, 8), np.float32)})
    table = {"a.proj": (Target("a.proj.weight"),), "b": (Target("b.weight"),)}
    path = write_case(scratch_dir("lora"), "lora.safetensors", data)
    merged = merge_loras(base, [path], table, family="fuzz", model="the fuzz model", allow_unmatched=True)
    for name in merged.names():
        np.asarray(merged[name]).tobytes()


def core_targets() -> list[FuzzTarget]:
    """Every dif-core reader of outside bytes (frontends' config readers are in their tests)."""
    program = tiny_program
    plan_load, plan_seed = {name: (load, seed) for name, load, seed in fuzz_cases()}["difplan"]
    section_load, section_seed = {name: (load, seed) for name, load, seed in fuzz_cases()}["difplan-plan-section"]
    targets = [
        FuzzTarget(
            "container",
            lambda b: container.unpack(b, CONTAINER_MAGIC, (1,), "fuzz"),
            lambda: [container.pack(CONTAINER_MAGIC, 1, {"a": b"alpha", "": b"", "c": bytes(range(40))})],
            "binary",
            "dif.serialize.container.unpack",
        ),
        FuzzTarget(
            ".difir", program_from_bytes, lambda: [program_to_bytes(program())], "binary",
            "dif.serialize.difir.program_from_bytes",
        ),
        FuzzTarget(
            ".difir program section", _load_program_section,
            lambda: [container.unpack(program_to_bytes(program()), MAGIC, (VERSION,), "fuzz")[1]["program"]],
            "json", "dif.serialize.difir.program_from_bytes",
        ),
        FuzzTarget(
            "provenance", provenance_from_bytes, lambda: [provenance_to_bytes(program())], "binary",
            "dif.serialize.provenance.provenance_from_bytes",
        ),
        FuzzTarget(
            "DiffIR text form", lambda b: parse_program(b.decode("utf-8", "replace")),
            lambda: [print_program(program()).encode()], "text", "dif.serialize.text.parse_program",
        ),
        FuzzTarget(".difplan", plan_load, lambda: [plan_seed()], "binary", "dif.plan.difplan.plan_from_bytes"),
        FuzzTarget(
            ".difplan plan section", section_load, lambda: [section_seed()], "json",
            "dif.plan.difplan.plan_from_bytes",
        ),
        FuzzTarget(".diftensor", _load_tensors, lambda: [_diftensor_bytes()], "binary",
                   "dif.serialize.diftensor.load_tensors"),
        FuzzTarget(
            "safetensors header", _load_safetensors_header, lambda: [_safetensors_header(_diftensor_bytes())],
            "json", "dif.serialize.diftensor.read_safetensors_header",
        ),
        FuzzTarget(
            "safetensors checkpoint file", _load_checkpoint_file, lambda: [_checkpoint_bytes(("x.weight", "y"))],
            "binary", "dif.weights.source.open_safetensors",
        ),
        FuzzTarget(
            "safetensors index JSON", _load_index, lambda: [_index_seed()], "json", "dif.weights.source.open_index"
        ),
        FuzzTarget(
            "scheduler_config.json", _load_scheduler, _scheduler_seeds, "json",
            "dif.kit.scheduler.load_scheduler_config",
        ),
        FuzzTarget(
            "tokenizer.json", _load_tokenizer_json, lambda: [_tokenizer_json()], "json",
            "dif.text.tokenizer.TextTokenizer.from_folder",
        ),
        FuzzTarget(
            "tokenizer_config.json", _load_tokenizer_file("tokenizer_config.json"), _tokenizer_config_seeds, "json",
            "dif.text.tokenizer.TextTokenizer.from_folder",
        ),
        FuzzTarget(
            "vocab.json", _load_tokenizer_file("vocab.json"), lambda: [_vocab_json()], "json",
            "dif.text.tokenizer.TextTokenizer.from_folder",
        ),
        FuzzTarget(
            "merges.txt", _load_tokenizer_file("merges.txt"), lambda: [_merges_txt()], "text",
            "dif.text.tokenizer.TextTokenizer.from_folder",
        ),
        FuzzTarget(
            "chat_template.jinja", _load_chat_template, lambda: [_CHAT_TEMPLATE.encode()], "text",
            "dif.text.chat.find_chat_template + render",
        ),
        FuzzTarget("bench recipe", _load_recipe, _recipe_seeds, "json", "dif.bench.recipe.load_recipe"),
        FuzzTarget("GGUF", _load_gguf, lambda: [_gguf_bytes()], "binary", "dif.weights.gguf.open_gguf"),
        FuzzTarget("LoRA file", _load_lora, _lora_seeds, "binary", "dif.lora.read_lora + merge_loras"),
    ]  # fmt: skip
    return targets


def config_file_target(
    name: str, folders: Sequence[Path], file: str, load: Callable[[Path], object], reader: str
) -> FuzzTarget:
    """A target for one JSON file of a checkpoint folder (`model_index.json`, `vae/config.json` ...):
    each case rewrites `file` in a scratch copy of `folders[0]` (made once, of links to the original
    files) and calls `load(copy)`. The seeds are `file` of every folder in `folders`."""
    scratch = f"cfg-{name}".replace("/", "-").replace(" ", "-")

    def copy() -> Path:
        root = scratch_dir(scratch) / "folder"
        if not root.is_dir():
            for src in Path(folders[0]).rglob("*"):
                dst = root / src.relative_to(folders[0])
                if src.is_dir():
                    dst.mkdir(parents=True, exist_ok=True)
                else:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.symlink_to(src.resolve())
        return root

    def load_case(data: bytes) -> None:
        root = copy()
        write_case(root / Path(file).parent, Path(file).name, data)
        load(root)

    return FuzzTarget(name, load_case, lambda: [(Path(f) / file).read_bytes() for f in folders], "json", reader)


# Formats issue 14 names that have no reader in dif yet: listed in the table, nothing to fuzz.
NOT_APPLICABLE: dict[str, str] = {}
