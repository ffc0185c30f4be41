"""Checkpoint access, step 2: a lazy `TensorSource` over a file, a sharded index, or a component folder.

A source is a read-only `Mapping[name, np.ndarray]` whose arrays are memmap views, plus `info()`
(dtype and shape without touching data) and `file_of()` (for error messages). Frontends open
sources here, rename them with `dif.weights.remap` and hand them to `dif.weights.bind_weights`.

Folder layouts understood (diffusers / transformers conventions):
  <stem>.safetensors                       one file
  <stem>.<variant>.safetensors             a variant such as fp16
  <stem>.safetensors.index.json            shards listed in "weight_map" (tensor -> file)
  <stem>.safetensors.index.<variant>.json  sharded variant
with stem `diffusion_pytorch_model` (diffusers) or `model` (transformers).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from dif.errors import CheckpointError, WeightError
from dif.weights.safetensors_file import SafetensorsFile, TensorInfo

DEFAULT_STEMS = ("diffusion_pytorch_model", "model")


class TensorSource(Mapping[str, np.ndarray]):
    """Base of every source: name -> array, lazily; subclasses implement `info` and `_load`."""

    label: str = "<tensors>"

    def info(self, name: str) -> TensorInfo:
        raise NotImplementedError

    def _load(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def names(self) -> list[str]:
        raise NotImplementedError

    def file_of(self, name: str) -> str:
        """Where `name` comes from, for messages: a path, or a path plus the original tensor name."""
        return str(self.info(name).file)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self:
            raise KeyError(name)
        return self._load(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        return name in set(self.names())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label} ({len(self)} tensors)>"


class FileSource(TensorSource):
    """Tensors spread over one or more safetensors files (one file, or the shards of an index)."""

    def __init__(self, where: Mapping[str, SafetensorsFile], label: str) -> None:
        self._where = dict(where)
        self.label = label

    @property
    def files(self) -> list[Path]:
        return sorted({f.path for f in self._where.values()})

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def info(self, name: str) -> TensorInfo:
        try:
            return self._where[name].tensors[name]
        except KeyError:
            raise WeightError(f"tensor '{name}' is not in {self.label}") from None

    def _load(self, name: str) -> np.ndarray:
        return self._where[name].get(name)


class ArraySource(TensorSource):
    """In-memory arrays presented as a source (tests, tensors computed by a frontend)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], label: str = "<memory>") -> None:
        self._arrays = {k: np.asarray(v) for k, v in arrays.items()}
        self.label = label

    def names(self) -> list[str]:
        return list(self._arrays)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def info(self, name: str) -> TensorInfo:
        from dif.dtypes import dtype_of

        arr = self._arrays[name]
        dtype = "F64" if arr.dtype == np.float64 else dtype_of(arr).safetensors_name
        return TensorInfo(name, dtype, tuple(arr.shape), 0, arr.nbytes, Path(self.label))

    def _load(self, name: str) -> np.ndarray:
        return self._arrays[name]


def open_safetensors(path: str | Path) -> FileSource:
    """A source over one safetensors file (header validated now, data mapped on access)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    f = SafetensorsFile(path)
    return FileSource({name: f for name in f.tensors}, str(path))


def open_index(index_path: str | Path) -> FileSource:
    """A source over the shards listed in a `*.safetensors.index*.json` file.

    Raises `CheckpointError` when the index is not JSON / has no weight_map, when a shard name is
    absolute or leads outside the index's folder, or when a shard is missing; `WeightError` when
    a shard lacks a tensor the index assigns to it; `FormatError` for a corrupt shard.
    """
    index_path = Path(index_path)
    folder = index_path.parent
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{index_path}: cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index_path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise CheckpointError(f"{index_path}: not valid JSON (nested too deeply)") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: no 'weight_map' object mapping tensor names to shard files")
    shards: dict[str, SafetensorsFile] = {}
    for shard_name in sorted(set(weight_map.values())):
        shard_path = _inside(folder, shard_name, index_path)
        try:
            present = shard_path.is_file()
        except OSError as exc:  # a name too long for the filesystem, ...
            raise CheckpointError(f"{index_path}: shard '{shard_name[:200]}': {exc.strerror}") from None
        if not present:
            raise CheckpointError(
                f"{index_path}: shard '{shard_name}' does not exist in {folder}",
                hint="the download is incomplete; fetch the missing shard",
            )
        shards[shard_name] = SafetensorsFile(shard_path)
    where: dict[str, SafetensorsFile] = {}
    for tensor, shard_name in weight_map.items():
        shard = shards[shard_name]
        if tensor not in shard:
            raise WeightError(
                f"tensor '{tensor}': {index_path.name} places it in {shard.path}, which does not contain it",
                hint="the index and its shards come from different checkpoints",
            )
        where[tensor] = shard
    return FileSource(where, f"{index_path} ({len(shards)} shards)")


def _inside(folder: Path, relative: str, index_path: Path) -> Path:
    """`folder/relative`, refusing names that are absolute or climb out of `folder`.

    The check is lexical (no symlink resolution) because HF caches link shards to blobs that
    legitimately live elsewhere; what we refuse is an index *naming* a path outside its folder.
    """
    if not relative or os.path.isabs(relative) or Path(relative).drive:
        raise CheckpointError(f"{index_path}: shard name '{relative}' is absolute; shard names must be relative")
    joined = os.path.normpath(os.path.join(folder, relative))
    base = os.path.normpath(folder)
    if os.path.commonpath([base, joined]) != base:
        raise CheckpointError(
            f"{index_path}: shard '{relative}' points outside the folder {folder}",
            hint="refusing to read files outside the checkpoint; the index is corrupt or hostile",
        )
    return Path(joined)


def weight_file_names(stem: str, variant: str | None) -> tuple[str, str]:
    """(index file name, single file name) for a stem and optional variant, diffusers-style."""
    if variant:
        return f"{stem}.safetensors.index.{variant}.json", f"{stem}.{variant}.safetensors"
    return f"{stem}.safetensors.index.json", f"{stem}.safetensors"


def open_component(
    folder: str | Path, *, variant: str | None = None, stems: tuple[str, ...] = DEFAULT_STEMS
) -> FileSource:
    """The weights of one component folder (`transformer/`, `vae/`, `text_encoder/` ...).

    An index wins over a single file of the same stem. When nothing matches, the error lists the
    safetensors files that are there (a variant the caller did not ask for is the usual cause).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: component folder does not exist")
    for stem in stems:
        index_name, file_name = weight_file_names(stem, variant)
        if (folder / index_name).is_file():
            return open_index(folder / index_name)
        if (folder / file_name).is_file():
            return open_safetensors(folder / file_name)
    present = sorted(p.name for p in folder.iterdir() if ".safetensors" in p.name)
    wanted = " or ".join(weight_file_names(s, variant)[1] for s in stems)
    hint = None
    variants = sorted(v for v in {_variant_of(n) for n in present} if v is not None)
    if variants and variant not in variants:
        hint = f"this folder has variant(s) {', '.join(map(str, variants))}; pass --variant"
    raise CheckpointError(
        f"{folder}: no weights found (looked for {wanted} and their indexes; present: {', '.join(present) or 'none'})",
        hint=hint,
    )


def _variant_of(file_name: str) -> str | None:
    parts = file_name.split(".")
    # name.fp16.safetensors / name.safetensors.index.fp16.json / name.fp16-00001-of-00002.safetensors
    if len(parts) == 3 and parts[-1] == "safetensors":
        return parts[1].split("-")[0]
    if len(parts) == 5 and parts[1:3] == ["safetensors", "index"]:
        return parts[3]
    return None
