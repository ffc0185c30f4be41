"""Hugging Face repo ids resolved in the local hub cache (no download): refs, commit prefixes,
HF_HUB_CACHE / HF_HOME, and a missing repo or revision that says where it looked."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.errors import CheckpointError
from dif.weights.hfcache import hub_cache, is_repo_id, resolve_model_path, resolve_repo

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def make_cache(root: Path) -> Path:
    repo = root / "models--acme--tiny-model"
    for commit in (COMMIT, OTHER):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "model_index.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT + "\n")
    (repo / "refs" / "v2").write_text(OTHER)
    return root


def test_resolves_refs_and_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snaps = cache / "models--acme--tiny-model" / "snapshots"
    assert resolve_model_path("acme/tiny-model") == snaps / COMMIT
    assert resolve_model_path("acme/tiny-model@v2") == snaps / OTHER
    assert resolve_model_path("acme/tiny-model@fedcba98") == snaps / OTHER
    assert resolve_model_path(f"acme/tiny-model@{COMMIT}") == snaps / COMMIT
    assert resolve_model_path(tmp_path) == tmp_path  # an existing path wins


def test_hf_home_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    make_cache(tmp_path / "hf" / "hub")
    assert hub_cache() == tmp_path / "hf" / "hub"
    assert resolve_repo("acme/tiny-model").name == COMMIT
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"


def test_missing_repo_or_revision_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = make_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(CheckpointError, match=r"'acme/absent' is neither .* \(looked for .*models--acme--absent\)"):
        resolve_model_path("acme/absent")
    with pytest.raises(CheckpointError, match=r"revision 'v9' is not in the cache .* cached refs: main, v2"):
        resolve_model_path("acme/tiny-model@v9")
    (cache / "models--acme--tiny-model" / "refs" / "broken").write_text("ab" * 20)
    with pytest.raises(CheckpointError, match="names commit abab"):
        resolve_model_path("acme/tiny-model@broken")
    with pytest.raises(CheckpointError, match="no such file or folder"):
        resolve_model_path("not a repo id")
    assert is_repo_id("org/name@main") and not is_repo_id("/abs/path") and not is_repo_id("a/b/c")
