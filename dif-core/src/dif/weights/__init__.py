"""Checkpoint tensors: safetensors files, sharded indexes, renaming rules and binding to programs.

Where it sits: frontends open a checkpoint here (`open_component`, `open_safetensors`, `open_gguf`), present it
under program names (`MappedSource`), and `bind_weights` checks it against a program before a
backend's `prepare` receives the weights. Nothing is read until a tensor is used (memmap).
"""

from dif.weights.bind import BoundWeights, Conversion, bind_weights
from dif.weights.gguf import GGUFFile, is_gguf, open_gguf
from dif.weights.remap import Chunk, DropUnitAxes, MappedSource, Rule, SwapHalves, Take
from dif.weights.safetensors_file import SafetensorsFile, TensorInfo, read_header
from dif.weights.source import (
    ArraySource,
    FileSource,
    TensorSource,
    open_component,
    open_index,
    open_safetensors,
    weight_file_names,
)

__all__ = [
    "ArraySource",
    "BoundWeights",
    "Chunk",
    "Conversion",
    "DropUnitAxes",
    "FileSource",
    "GGUFFile",
    "MappedSource",
    "Rule",
    "SafetensorsFile",
    "SwapHalves",
    "Take",
    "TensorInfo",
    "TensorSource",
    "bind_weights",
    "is_gguf",
    "open_gguf",
    "open_component",
    "open_index",
    "open_safetensors",
    "read_header",
    "weight_file_names",
]
