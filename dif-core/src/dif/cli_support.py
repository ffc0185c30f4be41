"""The click-free part of the image frontends' commands (`dif flux2 generate`, `dif krea2 info`, ...).

Where it sits: between the click commands that `dif.kit.commands` builds from a frontend's
`FrontendInfo` and the frontend's pipeline. `generate_image` runs a whole `generate` command on
any built `dif.image_pipeline.TextToImagePipeline`; `info_text` prints what the frontend's
`describe` found. Warnings go to stderr as they arise; the functions return what the command
prints on stdout (`--json`: one dif-telemetry/1 document).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import define, field, frozen

from dif.errors import UsageError

if TYPE_CHECKING:  # cli.py modules import this at `dif --help` time: keep it light
    from dif.image_pipeline import TextToImagePipeline
    from dif.target import RuntimeBudget

DTYPE_CHOICES = ("auto", "f32", "bf16", "f16")
"""`--dtype` values; "auto" runs in the checkpoint's storage dtype (`dif.checkpoint.storage_dtype`)."""

VRAM_BUDGET_HELP = (
    "Device memory the whole pipeline (text encoder + denoiser + VAE together) may hold, e.g. 12GB, 12GiB, "
    "12000MB or bytes (default: all that is free when it starts); programs that do not fit together are "
    "released between stages, and weights that still do not fit are streamed from host memory."
)
"""`--vram-budget` help; the option's value goes through `parse_byte_size`."""

_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_BYTE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@frozen
class ImageOptions:
    """A `generate` command's options as click parsed them, for the frontend `frontend`: the
    options every image frontend takes, and `settings`, the frontend's own (`FrontendInfo.settings`,
    None = its default; the seed always set). `started` is when the command began."""

    frontend: str
    prompt: str
    negative_prompt: str
    settings: dict[str, Any]
    init_noise: Path | None
    save_latents: Path | None
    backend: str | None
    dtype: str
    output: Path
    as_json: bool
    vram_budget: int | None = None  # bytes (`parse_byte_size`); None plans for all the free memory
    check_finite: bool = True  # stop at the first non-finite stage output (`dif.kit.finite`)
    allow_nonfinite_weights: bool = False  # warn about NaN / inf weights instead of refusing them
    preview: Path | None = None  # a latent preview image written while sampling (`dif.preview`)
    preview_every: int = 1  # steps between previews
    started: float = field(factory=time.perf_counter)

    @property
    def seed(self) -> int:
        return int(self.settings["seed"])

    @classmethod
    def parse(cls, frontend: str, options: Mapping[str, Any], settings: Mapping[str, Any]) -> ImageOptions:
        """`options` and `settings` with the defaults filled in: a fresh random seed, output FRONTEND-SEED.png."""
        from dif.media.image_file import image_format
        from dif.noise import random_seed

        seed = random_seed() if settings.get("seed") in (None, -1) else settings["seed"]  # -1: random
        output = options["output"] or Path(f"{frontend}-{seed}.png")
        image_format(output)  # an extension dif cannot write is refused before anything runs
        if options.get("preview") is not None:
            image_format(options["preview"])
        return cls(frontend=frontend, **{**options, "output": output}, settings={**settings, "seed": seed})

    def missing_folder(self) -> Path | None:
        """The first file to write (output, --save-latents, --preview) whose folder does not exist."""
        for path in (self.output, self.save_latents, self.preview):
            if path is not None and not path.resolve().parent.is_dir():
                return path
        return None

    def unwritable(self) -> tuple[Path, str] | None:
        """(path, why) of the first file to write (output, --save-latents, --preview) whose folder is not
        writable (files are written as a temp file there, then renamed)."""
        for path in (self.output, self.save_latents, self.preview):
            if path is not None and (why := unwritable_reason(path)) is not None:
                return path, why
        return None


def unwritable_reason(path: Path) -> str | None:
    """Why `path` cannot be written now (files are written by rename into its folder), or None."""
    import os

    folder = path.resolve().parent
    if not os.access(folder, os.W_OK | os.X_OK):  # a temp file is made there, then renamed over `path`
        return f"folder {folder} is not writable"
    return None


RUN_STAGES = ("load", "encode", "denoise", "decode", "save")
"""The stages of a `generate` run in order (`TextToImagePipeline.generate`'s, then the files)."""


@define
class RunProgress:
    """Where a `generate` run is, from the pipeline's `on_stage` / `on_step`: so Ctrl-C can say what it
    interrupted ("in the denoise stage after step 3 of 8"). Files are written by rename: none is left."""

    done: list[str] = field(factory=list)
    step: tuple[int, int] | None = None

    def finished(self, stage: str, seconds: float) -> None:
        self.done.append(stage)

    def where(self) -> str:
        """The stage under way and, while denoising, the last step done."""
        stage = next((s for s in RUN_STAGES if s not in self.done), "save")
        steps = f" after step {self.step[0]} of {self.step[1]}" if stage == "denoise" and self.step else ""
        return f"in the {stage} stage{steps}"

    @contextmanager
    def interrupts(self) -> Iterator[None]:
        """Ctrl-C in the body re-raised as a KeyboardInterrupt whose message is `where()`."""
        try:
            yield
        except KeyboardInterrupt:
            raise KeyboardInterrupt(self.where()) from None


def parse_byte_size(text: str) -> int:
    """Bytes of a memory size as people write it: "12GB" (10^9 each), "12GiB" (2^30 each), "12000MB",
    "1.5GiB", "4096" (bytes). Units are case-blind. `UsageError` for anything else or a size below one byte."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_UNITS:
        raise UsageError(
            f"'{text}' is not a memory size",
            hint="write a number with a unit: 12GB (10^9 bytes each), 12GiB (2^30), 12000MB, or plain bytes",
        )
    nbytes = int(Fraction(match.group(1)) * _BYTE_UNITS[unit])  # exact: "1.1GB" is 1100000000, not 1099999999
    if nbytes < 1:
        raise UsageError(f"memory size '{text}' is less than one byte")
    return nbytes


def telemetry_text(
    kind: str,
    tool: str,
    data: Mapping[str, Any],
    timings: Mapping[str, float] | None = None,
    runtime_budget: Mapping[str, RuntimeBudget] | None = None,
) -> str:
    """The dif-telemetry/1 document a `--json` command prints: `data`, `timings` (seconds per stage)
    as `stage.NAME` events, and the budgets plans were made against by backend name; `tool` is the
    command path (e.g. "dif flux2 generate")."""
    from dif.runstats import stage_events
    from dif.telemetry import build_document, dumps

    events = stage_events(timings or {})
    return dumps(build_document(kind, tool=tool, data=data, events=events, runtime_budget=runtime_budget))


def generate_image(
    opts: ImageOptions,
    pipe: TextToImagePipeline,
    *,
    version: str,
    tool: str,
    describe: Callable[[Mapping[str, Any]], str],
    inputs: Mapping[str, Any] | None = None,
    rank: int = 0,
) -> str:
    """One `generate` command on a built pipeline `pipe`: the request of `opts.settings` and `inputs`
    (`request_of`), a progress bar as the pipeline's `on_step`, its warnings on stderr, then the PNG and
    latents that `dif.report.save_image_run` writes, one pair per image of the batch (`batch_paths`).
    Returns what the command prints: the summary document (`--json`, with the pipeline's `memory_report` as
    "memory"; a batch lists every image under "batch") or its lines, naming the model `describe(settings)`.
    A `rank` other than 0 (`generate --gpus N`, `dif.kit.ranks`) runs the same work silently: no progress,
    warnings, preview or files, and returns ""."""
    from dif.image_pipeline import batch_paths
    from dif.kit.finite import run_checks
    from dif.progress import ProgressBar
    from dif.report import save_image_run, summary_lines

    req = request_of(opts, inputs)
    checks = run_checks(finite=opts.check_finite, allow_nonfinite_weights=opts.allow_nonfinite_weights)
    progress = RunProgress()
    writes = rank == 0
    with checks:
        warnings = pipe.resolve(req)[3]  # the request's own errors (sizes, steps) before any work
        preview = preview_writer(opts, pipe, req) if writes else None  # may fit the projection: one VAE decode
        with ProgressBar(quiet=opts.as_json or not writes) as bar, progress.interrupts():

            def on_step(done: int, total: int, latents: Any) -> None:
                bar.step(done, total)
                progress.step = (done, total)
                if preview is not None:
                    preview(done, total, latents)

            pipe.on_step, pipe.on_stage = on_step, progress.finished
            for warning in warnings if writes else ():
                print(f"warning: {warning}", file=sys.stderr, flush=True)
            results = pipe.generate_batch(req) if req.batch > 1 else [pipe.generate(req)]
            if not writes:
                return ""
            progress.done[:] = RUN_STAGES[:-1]  # what is left is writing the files
            outputs = batch_paths(opts.output, len(results))
            saved_latents = batch_paths(opts.save_latents, len(results)) if opts.save_latents else [None] * len(results)
            written = [
                save_image_run(result, out, latents=lat, frontend=opts.frontend, version=version, started=opts.started)
                for result, out, lat in zip(results, outputs, saved_latents, strict=True)
            ]
            result, (summary, timings) = results[0], written[0]
            if len(results) > 1:
                summary["batch"] = [
                    {"output": str(out), "seed": r.settings["seed"]} for r, out in zip(results, outputs, strict=True)
                ]
    memory = pipe.memory_report()
    summary["memory"] = memory
    if opts.as_json:
        planned = pipe.planned_budget
        budgets = {pipe.backend_name: planned} if planned is not None else None
        return telemetry_text(f"{opts.frontend}.generate", tool, summary, timings, budgets)
    more = [f"wrote {b['output']}  (seed {b['seed']})" for b in summary.get("batch", [])[1:]]
    return "\n".join([*summary_lines(summary, model=describe(result.settings)), *more, *memory_lines(memory)])


def request_of(opts: ImageOptions, inputs: Mapping[str, Any] | None = None) -> Any:
    """The frontend request of `opts.settings` and `inputs` (`dif.image_pipeline.image_request`: reference /
    init images, strength, mask, batch), with `--init-noise` read."""
    from dif.image_pipeline import image_request
    from dif.noise import load_noise_file

    noise = load_noise_file(opts.init_noise) if opts.init_noise is not None else None
    return image_request(
        opts.prompt, opts.settings, negative_prompt=opts.negative_prompt, init_noise=noise, **(inputs or {})
    )


def preview_writer(opts: ImageOptions, pipe: TextToImagePipeline, req: Any) -> Any:
    """The `dif.preview.PreviewWriter` of `--preview` (None without it): the checkpoint's projection
    (`dif.preview.projection_for`: packaged, or fitted now with one VAE decode) at the run's token grid."""
    if opts.preview is None:
        return None
    from dif.preview import PreviewWriter, projection_for

    width, height, _ = pipe.fit_size(*pipe.size(req))
    grid = (height // pipe.pixels_per_token, width // pipe.pixels_per_token)
    return PreviewWriter(opts.preview, opts.preview_every, projection_for(pipe), grid)


def memory_lines(memory: Mapping[str, Any]) -> list[str]:
    """The line a run prints about its memory budget and streamed weights (none when it had no budget
    and streamed nothing); `memory` is `dif.program_cache.ProgramCache.memory_report()`."""
    cap, streamed = memory["vram_budget_bytes"], memory["streamed_params"]
    strategies = sorted({d["strategy"] for d in memory.get("pipeline", {}).values()} - {"all-resident"})
    if cap is None and not streamed and not strategies:
        return []
    head = "no memory budget" if cap is None else f"memory budget {_mib_or_gib(cap)} for the pipeline"
    if strategies:  # `dif.plan.pipeline`: programs released between stages
        head += f" ({', '.join(strategies)}; released {', '.join(memory['releases']) or 'nothing'})"
    what = f"{streamed} of {memory['params']} parameters streamed ({_mib_or_gib(memory['streamed_bytes'])})"
    return [f"  {head}: {what}" if streamed else f"  {head}: all {memory['params']} parameters resident"]


def info_text(data: Mapping[str, Any], *, kind: str, tool: str, as_json: bool, title: str, defaults: str) -> str:
    """What an `info` command prints: `data` as a dif-telemetry/1 document (`--json`), or `title`,
    the path, a line each for transformer / text_encoder / vae (`component_line` when the part has
    weights, its architecture alone for published configs), `defaults` and the tokenizer folder."""
    from dif.checkpoint import component_line

    if as_json:
        return telemetry_text(kind, tool, data)
    parts = [
        component_line(part, data[part]) if "tensors" in data[part] else _architecture_line(part, data[part])
        for part in ("transformer", "unet", "text_encoder", "vae")
        if part in data  # a UNet model (SD-Turbo) has "unet" where a DiT has "transformer"
    ]
    tokenizer = data["tokenizer"] or "missing"
    return "\n".join([title, f"  path {data['path']}", *parts, f"  defaults: {defaults}", f"  tokenizer: {tokenizer}"])


def defaults_line(defaults: Mapping[str, Any]) -> str:
    """The `info` defaults line of `defaults` {"steps", "guidance", "cfg" (bool), "size", "dtype",
    optional "shift"}: "4 steps, no CFG, 512x512, f32"."""
    d = defaults
    cfg = f"guidance {d['guidance']}" if d["cfg"] else "no CFG"
    shift = [d["shift"]] if d.get("shift") else []
    return ", ".join([f"{d['steps']} steps", cfg, *shift, f"{d['size']}x{d['size']}", str(d["dtype"])])


def _architecture_line(name: str, description: Mapping[str, Any]) -> str:
    shape = ", ".join(f"{k} {v}" for k, v in description.items())
    return f"  {name}: {shape}; published config, no weights"


def _mib_or_gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"
