"""Checkpoint paths: a Hugging Face repo id (`org/name`, `org/name@revision`) found in the local cache.

Where it sits: before a frontend opens a checkpoint; `resolve_model_path("org/name")` is the
snapshot folder the Hugging Face hub client left on disk, so `-m black-forest-labs/FLUX.2-klein-4B`
works on a machine that downloaded it once. Nothing is downloaded. The cache layout (the hub
client's): `<cache>/models--<org>--<name>/refs/<branch or tag>` holds a commit hash, and
`snapshots/<commit>/` the files (links into `blobs/`). The cache is `HF_HUB_CACHE`, else
`HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
An existing file or folder always wins over a repo id of the same spelling.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dif.errors import CheckpointError

REPO_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(@(?P<rev>[\w./-]+))?")
COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_cache() -> Path:
    """The hub cache folder the environment names (see the module docstring for the order)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def is_repo_id(text: str) -> bool:
    """Whether `text` is spelled like `org/name[@revision]` (not whether that repo is cached)."""
    return REPO_ID.fullmatch(text) is not None


def resolve_repo(repo_id: str, revision: str | None = None, *, cache: Path | None = None) -> Path:
    """The snapshot folder of `repo_id` at `revision` (a branch or tag under refs/, or a commit hash
    or its prefix; default "main"). `CheckpointError` saying where it looked when it is not cached."""
    cache = hub_cache() if cache is None else cache
    org, name = repo_id.split("/", 1)
    folder = cache / f"models--{org}--{name}"
    said = f"{repo_id}@{revision}" if revision else repo_id
    hint = f"dif does not download; fetch it once with `hf download {repo_id}` (or set HF_HOME / HF_HUB_CACHE)"
    if not folder.is_dir():
        raise CheckpointError(
            f"'{said}' is neither a file or folder nor a repo in the Hugging Face cache (looked for {folder})",
            hint=hint,
        )
    snapshots = folder / "snapshots"
    rev = revision or "main"
    ref = folder / "refs" / rev
    commit: str | None = None
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif re.fullmatch(r"[0-9a-f]{4,40}", rev) and snapshots.is_dir():
        found = sorted(p.name for p in snapshots.iterdir() if p.name.startswith(rev))
        if len(found) > 1:
            raise CheckpointError(f"'{said}': revision {rev} matches several snapshots: {', '.join(found)}")
        commit = found[0] if found else None
    if commit is None:
        refs = sorted(p.name for p in (folder / "refs").iterdir()) if (folder / "refs").is_dir() else []
        raise CheckpointError(
            f"'{said}': revision {rev!r} is not in the cache (looked for {ref} and {snapshots}/{rev}*; "
            f"cached refs: {', '.join(refs) or 'none'})",
            hint=hint,
        )
    snapshot = snapshots / commit
    if not snapshot.is_dir():
        raise CheckpointError(f"'{said}': {ref} names commit {commit}, but {snapshot} does not exist", hint=hint)
    return snapshot


def resolve_model_path(path: str | Path) -> Path:
    """`path` itself when it exists, else the cached snapshot of the repo id it spells (`resolve_repo`);
    `CheckpointError` when it is neither."""
    given = Path(path)
    if given.exists():
        return given
    text = str(path)
    m = REPO_ID.fullmatch(text)
    if m is None:
        raise CheckpointError(f"{text}: no such file or folder")
    return resolve_repo(m["repo"], m["rev"])
