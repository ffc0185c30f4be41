"""dif.weights: safetensors validation, sharded indexes, variants, remapping and binding."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dif.errors import CheckpointError, FormatError, WeightError
from dif.ir import ProgramBuilder
from dif.serialize.diftensor import save_tensors
from dif.weights import (
    ArraySource,
    Chunk,
    DropUnitAxes,
    MappedSource,
    Rule,
    SwapHalves,
    Take,
    bind_weights,
    open_component,
    open_index,
    open_safetensors,
    read_header,
)

BF16 = np.dtype(ml_dtypes.bfloat16)


def _tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "b.weight": rng.standard_normal((4,)).astype(BF16),
        "c.count": np.array([7], dtype=np.int64),
    }


def _program(dtype: str = "f32", a_shape: tuple[int, ...] = (4, 3)):  # type: ignore[no-untyped-def]
    b = ProgramBuilder("tiny")
    x = b.input("x", (2, 3), dtype)
    w = b.param("a.weight", a_shape, dtype)
    bias = b.param("b.weight", (a_shape[0],), dtype)
    b.output(b.emit("linear", x, w, bias))
    return b.build()


def test_roundtrip_with_official_reader(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    path = tmp_path / "m.safetensors"
    t = {k: v for k, v in _tensors().items() if v.dtype != BF16}
    save_tensors(path, t, {"note": "x"}, dif_metadata=False)
    official = load_file(str(path))
    src = open_safetensors(path)
    assert sorted(src) == sorted(official)
    for name, arr in official.items():
        np.testing.assert_array_equal(src[name], arr)
    _, meta, _ = read_header(path)
    assert meta == {"note": "x"}


def test_tensors_are_readonly_memmap_views(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_tensors(path, _tensors(), dif_metadata=False)
    arr = open_safetensors(path)["a.weight"]
    assert not arr.flags.writeable
    assert arr.base is not None  # a view, not a copy
    assert arr.dtype == np.float32 and arr.shape == (4, 3)


def test_truncated_file_names_file_and_tensor(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_tensors(path, _tensors(), dif_metadata=False)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(FormatError, match=r"(?s)m\.safetensors: tensor .*outside the .* data bytes.*truncated"):
        open_safetensors(path)


@pytest.mark.parametrize(
    "blob, pattern",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "header length field"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 40) + b'{"t":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}'[:40], "JSON|dtype"),
    ],
)
def test_garbage_headers(tmp_path: Path, blob: bytes, pattern: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(FormatError, match=pattern):
        open_safetensors(path)


def test_offsets_disagreeing_with_shape(tmp_path: Path) -> None:
    header = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(FormatError, match="tensor 't'.*needs 8"):
        open_safetensors(path)


def _write_sharded(folder: Path, stem: str = "diffusion_pytorch_model", variant: str | None = None) -> dict:
    t = _tensors()
    tag = f".{variant}" if variant else ""
    shard1, shard2 = f"{stem}{tag}-00001-of-00002.safetensors", f"{stem}{tag}-00002-of-00002.safetensors"
    save_tensors(folder / shard1, {"a.weight": t["a.weight"]}, dif_metadata=False)
    save_tensors(folder / shard2, {"b.weight": t["b.weight"], "c.count": t["c.count"]}, dif_metadata=False)
    index = {"metadata": {"total_size": 0}, "weight_map": {"a.weight": shard1, "b.weight": shard2, "c.count": shard2}}
    name = f"{stem}.safetensors.index{tag}.json"
    (folder / name).write_text(json.dumps(index))
    return index


def test_sharded_folder_and_variant(tmp_path: Path) -> None:
    _write_sharded(tmp_path)
    src = open_component(tmp_path)
    assert sorted(src) == ["a.weight", "b.weight", "c.count"]
    assert src.file_of("b.weight").endswith("00002-of-00002.safetensors")
    np.testing.assert_array_equal(src["a.weight"], _tensors()["a.weight"])

    other = tmp_path / "v"
    other.mkdir()
    _write_sharded(other, variant="fp16")
    with pytest.raises(CheckpointError, match="pass --variant"):
        open_component(other)
    assert sorted(open_component(other, variant="fp16")) == ["a.weight", "b.weight", "c.count"]


def test_single_file_variant(tmp_path: Path) -> None:
    save_tensors(tmp_path / "model.fp16.safetensors", _tensors(), dif_metadata=False)
    assert "a.weight" in open_component(tmp_path, variant="fp16")
    with pytest.raises(CheckpointError, match="no weights found.*model.fp16.safetensors"):
        open_component(tmp_path)


def test_index_pointing_outside_folder(tmp_path: Path) -> None:
    inner = tmp_path / "c"
    inner.mkdir()
    save_tensors(tmp_path / "evil.safetensors", _tensors(), dif_metadata=False)
    (inner / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": "../evil.safetensors"}}))
    with pytest.raises(CheckpointError, match="points outside the folder"):
        open_component(inner)
    (inner / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": str(tmp_path / "evil.safetensors")}})
    )
    with pytest.raises(CheckpointError, match="absolute"):
        open_component(inner)


def test_index_missing_shard_and_mismatch(tmp_path: Path) -> None:
    index = _write_sharded(tmp_path)
    (tmp_path / index["weight_map"]["a.weight"]).unlink()
    with pytest.raises(
        CheckpointError, match="shard 'diffusion_pytorch_model-00001-of-00002.safetensors' does not exist"
    ):
        open_component(tmp_path)
    _write_sharded(tmp_path)
    index["weight_map"]["ghost.weight"] = index["weight_map"]["a.weight"]
    (tmp_path / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightError, match="tensor 'ghost.weight'.*does not contain it"):
        open_component(tmp_path)


def test_index_not_json(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text("{nope")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        open_index(tmp_path / "model.safetensors.index.json")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="weight_map"):
        open_index(tmp_path / "model.safetensors.index.json")


def test_bind_identity_and_conversion(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_tensors(path, _tensors(), dif_metadata=False)
    bound = bind_weights(_program("f32"), open_safetensors(path), ignore=[r"c\..*"])
    assert bound["a.weight"].dtype == np.float32
    assert bound["b.weight"].dtype == np.float32  # bf16 checkpoint -> f32 program
    np.testing.assert_array_equal(bound["b.weight"], _tensors()["b.weight"].astype(np.float32))
    assert [c.param for c in bound.conversions] == ["b.weight"]
    bound16 = bind_weights(_program("bf16"), open_safetensors(path), ignore=[r"c\..*"])
    assert bound16["a.weight"].dtype == BF16
    np.testing.assert_array_equal(bound16["a.weight"], _tensors()["a.weight"].astype(BF16))


def test_bind_reports_every_problem_with_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    t = _tensors()
    bad = {"a.weight": t["a.weight"][:, :2], "c.count": t["c.count"], "stray": t["c.count"]}
    save_tensors(path, bad, dif_metadata=False)
    with pytest.raises(WeightError) as info:
        bind_weights(_program("f32"), open_safetensors(path), ignore=[r"c\..*"])
    msg = str(info.value)
    assert "missing: 'b.weight'" in msg
    assert "mis-shaped: 'a.weight'" in msg and "F32[4,2]" in msg and "f32[4,3]" in msg and "m.safetensors" in msg
    assert "unexpected (not used by the program): 'stray'" in msg


def test_bind_mistyped_and_no_conversion() -> None:
    src = ArraySource({"a.weight": np.zeros((4, 3), np.int32), "b.weight": np.zeros(4, BF16)})
    with pytest.raises(WeightError, match="mis-typed: 'a.weight'.*I32 cannot feed f32"):
        bind_weights(_program("f32"), src)
    src = ArraySource({"a.weight": np.zeros((4, 3), np.float32), "b.weight": np.zeros(4, BF16)})
    with pytest.raises(WeightError, match="conversion disabled"):
        bind_weights(_program("f32"), src, convert=False)


def test_mapped_source_split_swap_squeeze() -> None:
    qkv = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)
    mod = np.arange(8, dtype=np.float32)
    conv = np.arange(6, dtype=np.float32).reshape(3, 2, 1, 1)
    base = ArraySource({"qkv": qkv, "mod": mod, "conv": conv, "extra": mod}, "orig.safetensors")
    rules = {
        "q": Rule("qkv", Chunk(0, 3)),
        "k": Rule("qkv", Chunk(1, 3)),
        "v": Rule("qkv", Chunk(2, 3)),
        "m": Rule("mod", SwapHalves()),
        "lin": Rule("conv", DropUnitAxes()),
    }
    src = MappedSource(base, rules)
    np.testing.assert_array_equal(src["k"], qkv[4:8])
    np.testing.assert_array_equal(src["m"], np.concatenate([mod[4:], mod[:4]]))
    assert src.info("lin").shape == (3, 2) and src["lin"].shape == (3, 2)
    assert "extra" in src and "qkv" not in src
    assert "from 'qkv', chunk 1 of 3" in src.file_of("k")
    with pytest.raises(WeightError, match="'nope'.*needed for 'x'"):
        MappedSource(base, {"x": Rule("nope")})


def test_take_reads_one_index_of_an_axis() -> None:
    kernel = np.arange(2 * 3 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 3, 2, 2)  # O, I, T, kh, kw
    base = ArraySource({"conv.weight": kernel, "conv.bias": np.zeros(2, np.float32)}, "vae.safetensors")
    src = MappedSource(base, {"conv.weight": Rule("conv.weight", Take(2, -1, what="last temporal tap"))})
    assert src.info("conv.weight").shape == (2, 3, 2, 2) and sorted(src) == ["conv.bias", "conv.weight"]
    np.testing.assert_array_equal(src["conv.weight"], kernel[:, :, -1])
    assert src["conv.weight"].flags.c_contiguous
    assert "last temporal tap (index -1 of axis 2)" in src.file_of("conv.weight")
    with pytest.raises(WeightError, match="axis 2 of size 3 has no index 3"):
        Take(2, 3).shape(kernel.shape)
    with pytest.raises(WeightError, match="no axis 5"):
        Take(5, 0).shape(kernel.shape)
