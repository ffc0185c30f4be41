"""`.diftensor` / safetensors: round trips for every dtype, interop with the safetensors library, header validation."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from dif.errors import DifError, FormatError, VersionError
from dif.serialize.diftensor import (
    NUMPY_OF,
    load_tensors,
    open_safetensors,
    read_safetensors_header,
    save_tensors,
)


def _sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 4).astype(dtype)


def _raw_file(path: Path, header: dict | bytes, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("st_name", sorted(NUMPY_OF))
def test_round_trip_every_dtype(st_name: str, tmp_path: Path) -> None:
    dtype = NUMPY_OF[st_name]
    tensors = {
        "t.matrix": _sample(dtype, (3, 5)),
        "t.scalar": _sample(dtype, (), seed=1),
        "t.empty": _sample(dtype, (0, 4)),
        "t.strided": _sample(dtype, (4, 6), seed=2)[:, ::2],
    }
    path = tmp_path / "a.diftensor"
    save_tensors(path, tensors, {"kind": "fixture"})
    back, meta = load_tensors(path)
    assert meta == {"kind": "fixture"}
    assert set(back) == set(tensors)
    for name, arr in tensors.items():
        assert back[name].dtype == dtype, name
        assert back[name].shape == arr.shape, name
        assert back[name].tobytes() == np.ascontiguousarray(arr).tobytes(), name
        assert not back[name].flags.writeable


def test_bf16_fp8_values_are_exact(tmp_path: Path) -> None:
    values = np.array([0.0, -1.5, 3.25, 448.0], dtype=np.float32)
    tensors = {
        "bf16": values.astype(ml_dtypes.bfloat16),
        "e4m3": values.astype(ml_dtypes.float8_e4m3fn),
        "e5m2": values.astype(ml_dtypes.float8_e5m2),
    }
    save_tensors(tmp_path / "f.diftensor", tensors)
    back, _ = load_tensors(tmp_path / "f.diftensor")
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name].astype(np.float32), arr.astype(np.float32))


def test_layout_is_aligned_dense_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "x.diftensor"
    tensors = {"a8": np.ones(3, np.uint8), "b64": np.ones(2, np.float64), "c16": np.ones(5, np.float16)}
    save_tensors(path, tensors)
    header, data_offset = read_safetensors_header(path)
    assert header["__metadata__"] == {"dif.format": "diftensor", "dif.version": "1"}
    assert data_offset % 8 == 0
    spans = sorted(tuple(header[n]["data_offsets"]) for n in tensors)
    assert spans == [(0, 16), (16, 26), (26, 29)]  # widest first, no holes
    assert data_offset + 29 == path.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.diftensor"]  # temp file renamed away


def test_big_endian_input_is_stored_little_endian(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    save_tensors(tmp_path / "be.diftensor", {"a": arr})
    back = open_safetensors(tmp_path / "be.diftensor")["a"]
    assert back.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(back, arr)


def test_write_rejects_what_it_cannot_store(tmp_path: Path) -> None:
    with pytest.raises(DifError, match="complex64"):
        save_tensors(tmp_path / "c.diftensor", {"z": np.zeros(2, np.complex64)})
    with pytest.raises(DifError, match="reserved"):
        save_tensors(tmp_path / "c.diftensor", {"a": np.zeros(2)}, {"dif.version": "9"})
    with pytest.raises(DifError, match="__metadata__"):
        save_tensors(tmp_path / "c.diftensor", {"__metadata__": np.zeros(2)})
    assert not (tmp_path / "c.diftensor").exists()


# -- interop with the safetensors library ---------------------------------------------------------


def test_files_from_safetensors_numpy_load(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    tensors = {"w": _sample(np.dtype(np.float32), (4, 3)), "ids": np.arange(5, dtype=np.int64), "m": np.ones(2, bool)}
    save_file(tensors, str(tmp_path / "plain.safetensors"), metadata={"format": "np"})
    back, meta = load_tensors(tmp_path / "plain.safetensors")
    assert meta == {"format": "np"}
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)


def test_our_files_load_in_safetensors_numpy(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    tensors = {n: _sample(NUMPY_OF[n], (2, 3)) for n in ("F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL")}
    save_tensors(tmp_path / "ours.diftensor", tensors)
    back = load_file(str(tmp_path / "ours.diftensor"))
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)


def test_bf16_fp8_interop_with_safetensors_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    ref = torch.tensor([[0.5, -2.0, 3.0], [448.0, 1.0, -0.25]])
    theirs = {"bf16": ref.to(torch.bfloat16), "e4m3": ref.to(torch.float8_e4m3fn), "e5m2": ref.to(torch.float8_e5m2)}
    save_file(theirs, str(tmp_path / "t.safetensors"))
    back, meta = load_tensors(tmp_path / "t.safetensors")
    assert meta == {}
    for name, t in theirs.items():
        np.testing.assert_array_equal(back[name].astype(np.float32), t.float().numpy())

    save_tensors(tmp_path / "o.diftensor", {name: back[name] for name in back})
    again = load_file(str(tmp_path / "o.diftensor"))
    for name, t in theirs.items():
        assert again[name].dtype == t.dtype
        assert torch.equal(again[name], t)


# -- header validation ----------------------------------------------------------------------------


def _entry(dtype: str = "F32", shape: list | None = None, offsets: list | None = None) -> dict:
    return {
        "dtype": dtype,
        "shape": [2] if shape is None else shape,
        "data_offsets": [0, 8] if offsets is None else offsets,
    }


@pytest.mark.parametrize(
    ("header", "data", "fragment"),
    [
        (b"{}"[:1], b"", "not valid JSON"),
        (b"[1, 2]", b"", "not a JSON object"),
        (
            b'{"a": ' + json.dumps(_entry()).encode() + b', "a": ' + json.dumps(_entry()).encode() + b"}",
            b"\0" * 8,
            "duplicate key 'a'",
        ),
        (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}', b"\0" * 8, "not valid JSON"),
        (b"\xff\xfe", b"", "not valid JSON"),
        ({"t": _entry("F12")}, b"\0" * 8, "tensor 't': unsupported dtype 'F12'"),
        ({"t": _entry(shape=[-2])}, b"\0" * 8, "tensor 't': shape"),
        ({"t": _entry(shape=[True, 2])}, b"\0" * 8, "tensor 't': shape"),
        ({"t": _entry(shape=[1 << 40, 1 << 40])}, b"\0" * 8, "absurdly large"),
        ({"t": _entry(offsets=[0])}, b"\0" * 8, "tensor 't': data_offsets"),
        ({"t": _entry(offsets=[0, 16])}, b"\0" * 8, "outside the 8 data bytes"),
        ({"t": _entry(offsets=[8, 4])}, b"\0" * 8, "outside"),
        ({"t": _entry(offsets=[0, 4])}, b"\0" * 8, "holds 4 bytes but F32[2] needs 8"),
        ({"a": _entry(), "b": _entry(offsets=[4, 12])}, b"\0" * 12, "tensors 'a' and 'b' overlap"),
        ({"__metadata__": {"k": 1}}, b"", "__metadata__"),
        ({"t": "F32"}, b"", "tensor 't': header entry is not an object"),
    ],
)
def test_bad_headers_are_format_errors(tmp_path: Path, header: dict | bytes, data: bytes, fragment: str) -> None:
    path = _raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(FormatError) as info:
        load_tensors(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)


def test_lengths_are_checked_against_the_file(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(FormatError, match="too short"):
        read_safetensors_header(short)
    long = tmp_path / "long.safetensors"
    long.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(FormatError, match="header length field says 1000"):
        read_safetensors_header(long)
    with pytest.raises(FormatError, match="cannot read"):
        open_safetensors(tmp_path / "missing.safetensors")


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "t.diftensor"
    save_tensors(path, {"first": np.zeros(4, np.float32), "second": np.ones(4, np.float32)})
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(FormatError, match="tensor 'second'.*outside"):
        load_tensors(path)


def test_holes_and_zero_size_tensors_are_allowed(tmp_path: Path) -> None:
    header = {"a": _entry(offsets=[8, 16]), "e": _entry(shape=[0, 3], offsets=[8, 8])}
    path = _raw_file(tmp_path / "h.safetensors", header, struct.pack("<4f", 9, 9, 1.0, 2.0))
    tensors = open_safetensors(path)
    np.testing.assert_array_equal(tensors["a"], [1.0, 2.0])
    assert tensors["e"].shape == (0, 3)


def test_dif_format_and_version_are_checked(tmp_path: Path) -> None:
    wrong_format = _raw_file(
        tmp_path / "f.safetensors", {"__metadata__": {"dif.format": "capture", "dif.version": "1"}}
    )
    with pytest.raises(FormatError, match="dif.format is 'capture'"):
        load_tensors(wrong_format)
    future = _raw_file(tmp_path / "v.safetensors", {"__metadata__": {"dif.format": "diftensor", "dif.version": "2"}})
    with pytest.raises(VersionError, match="version '2'"):
        load_tensors(future)
    assert open_safetensors(future) == {}  # the low-level reader does not care about dif keys
