"""GGUF reading: dequantization bit-exact against the `gguf` package's reference for every type dif
reads, files written by gguf's own writer read back (names, numpy shapes, values), and bad files
(truncated, unknown type id, unsupported type, not GGUF) refused naming the file and tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.errors import FormatError
from dif.weights.gguf import GGML_TYPES, dequantize, open_gguf

gguf = pytest.importorskip("gguf", reason="the gguf package is the reference reader / writer")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize as ref_dequantize  # noqa: E402
from gguf.quants import quantize as ref_quantize  # noqa: E402

BLOCK_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
SCALE_OFFSETS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2)}
SCALE_OFFSETS.update({"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)})


def kind(name: str):  # type: ignore[no-untyped-def]
    return next(t for t in GGML_TYPES.values() if t.name == name)


def random_blocks(name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Raw blocks with every bit pattern in the quants and finite float16 scales: (rows, bytes per row)."""
    k = kind(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * cols // k.block, k.nbytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[name]:
        scales = (rng.standard_normal(len(raw)) * 0.02).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_dequantize_is_bit_exact(name: str) -> None:
    qtype = getattr(Q, name)
    raws = [random_blocks(name, 3, 512, seed) for seed in range(3)]
    if name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # gguf quantizes these in Python: real blocks too
        x = np.random.default_rng(9).standard_normal((3, 512)).astype(np.float32)
        raws.append(ref_quantize(x, qtype))
    for raw in raws:
        expected = ref_dequantize(raw, qtype)
        got = dequantize(raw.reshape(-1), name, expected.shape)
        assert got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32)), name


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, object]], arch: str = "flux") -> Path:
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_file_round_trip(tmp_path: Path) -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    tensors = {
        "a.q8": (ref_quantize(x, Q.Q8_0), Q.Q8_0),
        "b.q6k": (random_blocks("Q6_K", 2, 256, 1), Q.Q6_K),
        "c.f16": (x.astype(np.float16), Q.F16),
        "d.bf16": (x.astype(ml_dtypes.bfloat16).view(np.uint16), Q.BF16),
        "e.f32": (x[0], Q.F32),
        "f.3d": (rng.standard_normal((2, 3, 32)).astype(np.float32), Q.F32),
    }
    path = write_gguf(tmp_path / "m.gguf", tensors)
    src = open_gguf(path)
    reader = gguf.GGUFReader(str(path))
    assert src.architecture == "flux" and src.names() == list(tensors)
    for t in reader.tensors:
        want = ref_dequantize(t.data, t.tensor_type)
        want_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        assert src.info(t.name).shape == want_shape, t.name
        got = np.asarray(src[t.name], dtype=np.float32)
        assert np.array_equal(got, np.asarray(want, np.float32).reshape(want_shape)), t.name
    assert src.info("c.f16").dtype == "F16" and src.info("d.bf16").dtype == "BF16" and src.info("a.q8").dtype == "F32"
    assert src.stored_type("a.q8") == "Q8_0" and "(Q8_0)" in src.file_of("a.q8")


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    path = write_gguf(tmp_path / "m.gguf", {"first": (x, Q.F32), "second": (ref_quantize(x, Q.Q8_0), Q.Q8_0)})
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    with pytest.raises(FormatError, match=r"cut.gguf: truncated GGUF: tensor 'second' ends at byte"):
        open_gguf(cut)
    cut.write_bytes(data[:60])  # inside the header
    with pytest.raises(FormatError, match=r"cut.gguf: truncated GGUF"):
        open_gguf(cut)
    cut.write_bytes(b"GGUF")
    with pytest.raises(FormatError, match="truncated GGUF"):
        open_gguf(cut)


def test_unknown_and_unsupported_types(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    path = write_gguf(tmp_path / "m.gguf", {"w": (x, Q.F32)})
    data = bytearray(path.read_bytes())
    # the tensor table entry: name, n_dims=2, dims, type (uint32 0 = F32), offset; patch the type field
    at = data.index(b"w") + 1 + 4 + 16
    assert data[at : at + 4] == (0).to_bytes(4, "little")
    data[at : at + 4] = (99).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"bad.gguf: tensor 'w' has unknown GGUF type id 99"):
        open_gguf(bad)
    q2k = write_gguf(tmp_path / "q2k.gguf", {"w": (np.zeros((4, 84), np.uint8), Q.Q2_K)})
    with pytest.raises(FormatError, match=r"q2k.gguf: 1 tensor\(s\) are stored as Q2_K, which dif does not dequantize"):
        open_gguf(q2k)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(FormatError, match="not a GGUF file"):
        open_gguf(path)
    path.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + bytes(100))
    with pytest.raises(FormatError, match="GGUF version 7"):
        open_gguf(path)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "Q6_K"])
def test_threaded_chunks_equal_one_pass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.weights.gguf as g

    raw = random_blocks(name, 8, 2048, 5)
    expected = ref_dequantize(raw, getattr(Q, name))
    monkeypatch.setattr(g, "CHUNK_BLOCKS", 7)  # many ragged chunks
    got = dequantize(raw.reshape(-1), name, expected.shape, threads=3)
    assert np.array_equal(got.view(np.uint32), expected.astype(np.float32).view(np.uint32))


def test_q8_0_quantizer_matches_gguf_and_writer_round_trips(tmp_path: Path) -> None:
    from dif.weights.gguf import quantize_q8_0, write_gguf

    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 96)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0
    x[1, :32] = 0.5 * 127 / 127  # ties at .5 after scaling
    ours = quantize_q8_0(x)
    assert np.array_equal(ours, ref_quantize(x, Q.Q8_0))
    norm = rng.standard_normal(96).astype(np.float32)
    tensors = [("w", "Q8_0", x.shape), ("n", "F32", norm.shape)]
    path = tmp_path / "w.gguf"
    write_gguf(path, tensors, {"w": ours, "n": norm.view(np.uint8)}.__getitem__, {"general.architecture": "flux"})
    reader = gguf.GGUFReader(str(path))  # gguf's own reader accepts the file
    assert [t.name for t in reader.tensors] == ["w", "n"]
    src = open_gguf(path)
    assert src.architecture == "flux" and src.stored_type("w") == "Q8_0"
    assert np.array_equal(src["w"], ref_dequantize(ours, Q.Q8_0)) and np.array_equal(src["n"], norm)


def test_q4_0_blocks_are_int4_groups_of_32(tmp_path: Path) -> None:
    """Q4_0 blocks re-packed as `int4_linear`'s groups of 32 (`dif.weights.gguf_int4.q4_0_groups`) hold exactly
    the values gguf's reference dequantizer reads from them, and `int4_linear` over them is linear over those
    values; read back through a file, a renamed source and a chunk of rows (one part of a fused qkv)."""
    from dif.ops.quant import dequantize_groups, int4_linear
    from dif.weights.bind import bind_weights
    from dif.weights.gguf_int4 import q4_0_groups, stored_q4_0
    from dif.weights.remap import Chunk, MappedSource, Rule

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    raw = np.asarray(ref_quantize(w, Q.Q4_0), np.uint8)
    values = np.asarray(ref_dequantize(raw, Q.Q4_0), np.float32).reshape(w.shape)
    packed, scales = q4_0_groups(raw, *w.shape)
    assert packed.shape == (48, 48) and packed.dtype == np.uint8 and scales.shape == (48, 3)
    np.testing.assert_array_equal(dequantize_groups(packed, scales, 32), values)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    np.testing.assert_allclose(int4_linear(x, packed, scales, group_size=32), x @ values.T, rtol=1e-5, atol=1e-6)

    from dif.weights.gguf import write_gguf as write_file

    path = tmp_path / "q.gguf"
    write_file(path, [("qkv.weight", "Q4_0", w.shape), ("norm", "F32", (96,))],
               lambda n: raw if n == "qkv.weight" else np.ones(96, np.float32))  # fmt: skip
    file = open_gguf(path)
    source = MappedSource(file, {"k.weight": Rule("qkv.weight", Chunk(1, 3))})
    from dif.ir.program import Program, Value
    from dif.ir.types import TensorType

    program = Program("p", [], [Value("k.weight", TensorType((16, 96), "f32"))], [], [])
    bound = bind_weights(program, source, ignore=lambda n: True)
    stored = stored_q4_0(bound, "k.weight")
    assert stored is not None
    q, s = stored.load()
    np.testing.assert_array_equal(dequantize_groups(q, s, 32), values[16:32])
    np.testing.assert_array_equal(bound["k.weight"], values[16:32])  # what the dequantizing path reads
    norm = Program("n", [], [Value("norm", TensorType((96,), "f32"))], [], [])
    assert stored_q4_0(bind_weights(norm, file, ignore=lambda n: True), "norm") is None  # F32
