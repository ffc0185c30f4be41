"""The setup stage of the edit `dif bench` recipes: reference images and a klein KV variant of a folder.

    python perf/reference/make_edit_inputs.py --images WORKDIR/refs --size 1024 --count 2 \
        [--kv-of WORKDIR/models/klein-9b --kv-out WORKDIR/models/klein-9b-kv]

Writes COUNT RGB PNGs (smooth gradients plus noise, seeded) of SIZE x SIZE under --images (ref-0.png, ...),
and with --kv-of a folder of symbolic links to that checkpoint's files whose model_index.json names
`Flux2KleinKVPipeline` (the klein KV variant has klein 9B's architecture and tensor names; its published
weights differ, random ones time the same). Files are written as NAME.partial and renamed, so an
interrupted run leaves nothing that passes for complete. Only numpy and Pillow are needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def write_images(folder: Path, size: int, count: int) -> list[Path]:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        rng = np.random.default_rng(i)
        yy, xx = np.mgrid[0:size, 0:size]
        base = np.stack([xx * 255 // size, yy * 255 // size, (xx + yy) * 127 // size], axis=-1)
        pixels = np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)
        path = folder / f"ref-{i}.png"
        partial = path.with_suffix(".partial.png")
        Image.fromarray(pixels, "RGB").save(partial)
        partial.replace(path)
        paths.append(path)
    return paths


def write_kv_variant(source: Path, out: Path) -> None:
    if (out / "model_index.json").is_file():
        return
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name != "model_index.json" and not (partial / entry.name).exists():
            os.symlink(entry.resolve(), partial / entry.name)
    index = json.loads((source / "model_index.json").read_text())
    index["_class_name"] = "Flux2KleinKVPipeline"
    index.pop("is_distilled", None)  # the KV pipeline has none (always distilled)
    (partial / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    partial.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, required=True, help="folder for ref-0.png, ref-1.png, ...")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--kv-of", type=Path, help="a klein diffusers folder to make a KV variant of")
    parser.add_argument("--kv-out", type=Path, help="where the KV variant goes (with --kv-of)")
    args = parser.parse_args(argv)
    paths = write_images(args.images, args.size, args.count)
    print(f"wrote {', '.join(map(str, paths))}", file=sys.stderr)
    if args.kv_of is not None:
        if args.kv_out is None:
            parser.error("--kv-of needs --kv-out")
        write_kv_variant(args.kv_of, args.kv_out)
        print(f"KV variant of {args.kv_of} at {args.kv_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
