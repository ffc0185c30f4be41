"""A plain clone is the whole project: no code, test or launcher reads the `shared/` folder that sits
beside the repo on the development machines (model configs and tokenizer files live in the repo as
package data), and every variant a frontend names has its published configs shipped with it."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from dif.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
# `../shared`, an absolute path into it, a pathlib join onto a "shared" folder, or a string path starting there
# (prose that names where a file came from, "copied from shared/model-configs", is no reference).
SHARED_REF = re.compile(r"\.\./shared\b|/work/shared\b|/\s*[\"']shared[\"']|[\"']shared/")
# Not run by anything: prose, and the developer tools that regenerate the embedded checkpoints
# (run by hand, with their source folders as arguments).
NOT_RUNTIME = re.compile(r".*\.md$|dif-frontend-[^/]+/scripts/.*")
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()
MAX_TEXT = 1_000_000  # the tokenizer vocab/merges files: data, not references


def _repo_files() -> list[str]:
    """Tracked files plus new ones git does not ignore; a tree walk where there is no git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.decode()
        return sorted({name for name in out.split("\0") if name})
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
        return sorted(
            p.relative_to(REPO).as_posix()
            for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(REPO).parts)
        )


@pytest.mark.parametrize(
    ("line", "flagged"),
    [
        ('QWEN = Path(__file__).parents[3] / "shared" / "tokenizers" / "qwen3-vl"', True),
        ("cp -r ../shared/model-configs .", True),
        ("MODEL_CONFIGS = '/work/shared/model-configs'", True),
        ('open("shared/tokenizers/qwen3-vl/vocab.json")', True),
        ("# values copied from shared/model-configs", False),
        ("shared = b.emit('mul', x, x)  # shared by q and k", False),
        ("launch(fn, grid, block, args, shared=4096)", False),
    ],
)
def test_the_pattern_finds_references_to_the_shared_folder(line: str, flagged: bool) -> None:
    assert bool(SHARED_REF.search(line)) is flagged


def test_no_runtime_file_reads_the_shared_folder() -> None:
    files = [f for f in _repo_files() if f != THIS_FILE and not NOT_RUNTIME.fullmatch(f)]
    assert len(files) > 100, f"only {len(files)} files found under {REPO}"
    hits = []
    for name in files:
        path = REPO / name
        if not path.is_file() or path.stat().st_size > MAX_TEXT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: weights, images
        hits += [
            f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if SHARED_REF.search(line)
        ]
    assert hits == [], "these read ../shared; use package data (<frontend>.configs, default/tokenizer):\n" + "\n".join(
        hits
    )


@pytest.mark.parametrize("frontend", ["flux2", "krea2"])
def test_every_variant_has_its_published_configs(frontend: str) -> None:
    plugin = pytest.importorskip(f"dif_frontend_{frontend}.plugin")
    configs = pytest.importorskip(f"dif_frontend_{frontend}.configs")
    for variant in plugin.INFO.variants:
        folder = configs.published(variant)
        index = json.loads((folder / "model_index.json").read_text())
        assert "transformer" in index, f"{folder}: model_index.json names no transformer"
        for component in ("transformer", "text_encoder", "vae"):
            assert (folder / component / "config.json").is_file(), f"{folder}/{component}/config.json is missing"
    shipped = sorted(p.parent.name for p in Path(configs.__file__).parent.glob("*/model_index.json"))
    assert shipped == sorted(plugin.INFO.variants), "configs/ folders and FrontendInfo.variants differ"
    with pytest.raises(UsageError, match="known variants: " + re.escape(", ".join(shipped))):
        configs.published("no-such-variant")
