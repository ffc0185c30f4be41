"""Bad LoRA / GGUF / single-file inputs through `dif flux2 generate`: each refused naming what is wrong,
exit != 0, no traceback, nothing written (the cases of issue 18 not already run through the CLI in
test_lora_cli.py, test_gguf.py and test_hfcache_cli.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "1", "--steps", "1"]


def gguf_with_type(path: Path, type_id: int) -> Path:
    """A one-tensor GGUF whose tensor claims ggml type `type_id` (written by hand)."""
    import struct

    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + s("single_stream_modulation.lin.weight")
    head += struct.pack("<IQQIQ", 2, 256, 4, type_id, 0)
    head += bytes(-len(head) % 32)
    path.write_bytes(head + bytes(4 * 256 * 4))
    return path


def run(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", *args, *COMMON, "-o", str(out)])
    return result.exit_code, result.output, out


def test_rank_mismatch(tmp_path: Path) -> None:
    lora = tmp_path / "bad-rank.safetensors"
    save_tensors(
        lora,
        {
            "transformer.proj_out.lora_A.weight": np.zeros((4, 64), np.float32),
            "transformer.proj_out.lora_B.weight": np.zeros((128, 8), np.float32),
        },
        dif_metadata=False,
    )
    code, said, out = run(tmp_path, "--lora", str(lora))
    assert code != 0 and not out.exists() and "Traceback" not in said
    assert "bad-rank.safetensors" in said and "rank mismatch" in said and "lora_B.weight" in said


@pytest.mark.parametrize("type_id, expected", [(99, "unknown GGUF type id 99"), (10, "stored as Q2_K")])
def test_unknown_and_unsupported_gguf_types(tmp_path: Path, type_id: int, expected: str) -> None:
    path = gguf_with_type(tmp_path / "odd.gguf", type_id)
    code, said, out = run(tmp_path, "-m", str(DEFAULT_CHECKPOINT), "--transformer", str(path))
    assert code != 0 and not out.exists() and "Traceback" not in said
    assert "odd.gguf" in said and expected in said


def test_not_a_transformer_file(tmp_path: Path) -> None:
    path = tmp_path / "random.safetensors"
    save_tensors(path, {"something": np.zeros(3, np.float32)}, dif_metadata=False)
    code, said, out = run(tmp_path, "-m", str(DEFAULT_CHECKPOINT), "--transformer", str(path))
    assert code != 0 and not out.exists() and "random.safetensors" in said and "not a FLUX.2 transformer" in said
