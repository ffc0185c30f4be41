"""A frontend's `generate` and `info` click commands, made from its `FrontendInfo`: the options
every image frontend takes are declared here once, the frontend's settings (steps, guidance, size,
seed) come from its `SettingSpec`s with their help derived from them, and the commands go through
`FrontendInfo.pipeline` / `resolve_settings` / `describe`.

Where it sits: a frontend's cli.py calls `image_commands(INFO, ...)`; its plugin's
`register_commands` adds the group to `dif`. This is the one module of dif-core that imports click
(a dif-core dependency; tests/test_repo_contracts.py allows exactly this file): the builder needs
click's types, and putting it in dif-tools would make every frontend depend on the tool. Nothing
imports it at `import dif` time; cli.py modules load it when `dif` asks for their commands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from dif.cli_support import DTYPE_CHOICES, VRAM_BUDGET_HELP
from dif.errors import UsageError
from dif.frontend import FrontendInfo, SettingSpec

Decorator = Callable[[Any], Any]


def _model_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """A checkpoint path, or the cached snapshot of a Hugging Face repo id (`dif.weights.hfcache`)."""
    from dif.errors import CheckpointError
    from dif.weights.hfcache import resolve_model_path

    try:
        return None if value is None else resolve_model_path(value)
    except CheckpointError as exc:
        raise click.BadParameter(str(exc)) from None


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from dif.cli_support import parse_byte_size

    try:
        return None if value is None else parse_byte_size(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


def setting_option(spec: SettingSpec) -> Decorator:
    """The click option of one setting: its flags (default `--name`), a type with its bounds or
    choices, no click default (None = the checkpoint's default), and the setting's help."""
    kind = spec.value_type
    lo, hi = spec.minimum, spec.maximum
    ptype: Any
    if spec.choices is not None:
        ptype = click.Choice([str(c) for c in spec.choices])
    elif kind is int:
        ptype = click.IntRange(None if lo is None else int(lo), None if hi is None else int(hi))
    elif kind is float:
        ptype = click.FloatRange(lo, hi)
    else:
        ptype = kind or str
    flags = spec.flags or (f"--{spec.name.replace('_', '-')}",)
    return click.option(*flags, spec.name, type=ptype, default=None, help=spec.help)


LORA_OPTIONS: list[Decorator] = [
    click.option(
        "--lora",
        multiple=True,
        metavar="FILE[:SCALE]",
        help="LoRA / LoKr / LoHa adapter for the denoiser and text encoder (repeatable; SCALE default 1, both parts). "
        "Dialects: diffusers/PEFT, kohya, ai-toolkit/ComfyUI, OneTrainer, LyCORIS.",
    ),
    click.option(
        "--lora-allow-unmatched",
        is_flag=True,
        help="Merge a LoRA's matching modules and warn about keys that match none (default: refuse the file).",
    ),
    click.option(
        "--lora-mode",
        type=click.Choice(["auto", "merged", "unmerged"]),
        default="auto",
        show_default=True,
        help="merged: folded into the weights at load (no per-step cost); unmerged: low-rank side GEMMs with "
        "the adapters as program inputs (swap without preparing again); auto: the planner decides and records "
        "why (merged for a fixed set, unmerged when swapping is asked for or the merged weights do not fit).",
    ),
    click.option(
        "--lora-swappable",
        is_flag=True,
        help="Prepare the denoiser so adapters and scales can be swapped later (auto then runs them unmerged).",
    ),
]
"""The LoRA options of a frontend that merges adapters (`dif.lora`): pass them in
`checkpoint_options`; they reach `info.pipeline` as `lora=(spec, ...)`, `lora_allow_unmatched`, `lora_mode`,
`lora_swappable`."""


def image_input_options() -> list[Decorator]:
    """The options of what a run reads besides the prompt (`dif.image_pipeline.IMAGE_INPUTS`): reference
    images, the img2img source with its strength and mask, the batch size, the reference K/V cache. Their
    values are checked, and the images decoded, by `read_image_inputs` before anything loads."""
    image = click.Path(dir_okay=False, path_type=Path)
    return [
        click.option(
            "-r", "--ref-image", "ref_images", type=image, multiple=True,
            help="Reference image to edit from or compose with (repeat for several; FLUX.2 klein takes up to 4). "
            "Without -W/-H the output takes the first one's size.",
        ),
        click.option(
            "-i", "--init-image", type=image,
            help="img2img source: the run starts from it noised to --strength (output at its size, cut to the token "
            "grid).",
        ),
        click.option(
            "--strength", type=float, help="img2img: the share of the schedule that runs, in (0, 1] (default 1.0)."
        ),
        click.option(
            "--mask", type=image, help="Inpainting mask for --init-image, of its size: white repaints, black keeps."
        ),
        click.option(
            "-b", "--batch", type=int, default=1, show_default=True,
            help="Images per call, one denoiser program of batch N; seeds SEED, SEED+1, ...; outputs NAME-0.png, "
            "NAME-1.png ... or -o with %d.",
        ),
        click.option(
            "--kv-cache/--no-kv-cache", default=None,
            help="Compute the reference images' keys/values once, at the first step, and reuse them (default: on "
            "for FLUX.2 klein KV checkpoints).",
        ),
    ]  # fmt: skip


def _apply(fn: Any, decorators: Sequence[Decorator]) -> Any:
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def _flags_of(info: FrontendInfo, message: str) -> str | None:
    """The CLI flags of the setting a request error names first (e.g. "width 1000 is not ...")."""
    for spec in info.settings:
        if message.startswith(spec.name) or f"'{spec.name}'" in message:
            return " / ".join(spec.flags or (f"--{spec.name}",))
    return None


def image_commands(
    info: FrontendInfo,
    *,
    help: str,
    model_help: str,
    describe_run: Callable[[Mapping[str, Any]], str],
    checkpoint_options: Sequence[Decorator] = (),
) -> click.Group:
    """The `dif NAME` group of an image frontend with its `generate` and `info` commands.

    `checkpoint_options` are the frontend's own click options that say where the checkpoint's
    parts are (FLUX.2's --base, --transformer, --vae); their values go to `info.pipeline` as
    keywords. `describe_run(settings)` names the model in the summary line."""
    name = info.name

    @click.group(name, help=help)
    def group() -> None:
        pass

    common_load = [
        click.option(
            "-m",
            "--model",
            callback=_model_path,
            help=f"{model_help} A Hugging Face repo id (org/name[@revision]) is looked up in the local HF cache.",
        ),
        *checkpoint_options,
        click.option(
            "--weight-variant", help="Weight files to load, e.g. fp16 (diffusion_pytorch_model.fp16.safetensors)."
        ),
    ]
    options = [
        click.option("-p", "--prompt", required=True, help="What to draw."),
        click.option("-n", "--negative-prompt", default="", help="Negative prompt (used when CFG is on)."),
        *common_load,
        *(setting_option(spec) for spec in info.settings),
        click.option(
            "--init-noise",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="Initial noise (safetensors), unpacked or packed latents of the run's size: exact parity with "
            "another tool (what --save-latents wrote as 'noise').",
        ),
        *image_input_options(),
        click.option(
            "--save-latents", type=click.Path(dir_okay=False, path_type=Path), help="Also save final latents."
        ),
        click.option(
            "--preview",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Write a cheap preview of the latents (a per-model linear latent -> RGB map, no VAE) to this "
            "image file while sampling (.png, .jpg, .webp; replaced atomically).",
        ),
        click.option(
            "--preview-every",
            type=click.IntRange(1),
            default=1,
            show_default=True,
            help="Steps between previews (the last step always writes one).",
        ),
        click.option(
            "--backend", help="dif backend (default: DIF_BACKEND or the best available; 'interp' = reference)."
        ),
        click.option(
            "--dtype",
            type=click.Choice(DTYPE_CHOICES),
            default="auto",
            show_default=True,
            help="Run precision (auto: the checkpoint's storage dtype).",
        ),
        click.option("--vram-budget", metavar="SIZE", callback=_byte_size, help=VRAM_BUDGET_HELP),
        click.option(
            "-o",
            "--output",
            type=click.Path(dir_okay=False, path_type=Path),
            help=f"Image path; the extension picks the format: .png, .jpg / .jpeg, .webp (default: {name}-SEED.png).",
        ),
        click.option(
            "--check-finite/--no-check-finite",
            default=True,
            show_default=True,
            help="Stop at the first NaN / infinite value a stage outputs (text features, each step, latents, image).",
        ),
        click.option(
            "--allow-nonfinite-weights",
            is_flag=True,
            help="Warn about weights holding NaN / infinite values instead of refusing to load them.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout."),
        click.option(
            "--gpus",
            type=click.IntRange(1),
            help="Ranks to run on, one process per device: 2 runs CFG-parallel (the prompt and the negative "
            "prompt's denoiser passes at once; needs CFG on). Under torchrun, the ranks it started (WORLD_SIZE). "
            "Rank 0 writes the files.",
        ),
    ]

    def generate(model: Path | None, weight_variant: str | None, **given: Any) -> None:
        """Generate one image from a prompt and write it as PNG (A1111 `parameters` + `dif` JSON chunks)."""
        from dif.cli_support import ImageOptions, generate_image
        from dif.image_pipeline import IMAGE_INPUTS, read_image_inputs
        from dif.kit.ranks import rank_mode

        mode = rank_mode(given.pop("gpus"))
        settings = info.resolve_settings({s.name: given.pop(s.name) for s in info.settings})
        common = ("prompt", "negative_prompt", "init_noise", "save_latents", "backend", "dtype", "output", "as_json")
        checks = ("vram_budget", "check_finite", "allow_nonfinite_weights", "preview", "preview_every")
        opts = ImageOptions.parse(name, {k: given.pop(k) for k in (*common, *checks)}, settings)
        images = read_image_inputs(**{k: given.pop(k) for k in IMAGE_INPUTS})  # decoded before anything loads
        if (missing := opts.missing_folder()) is not None:
            raise click.BadParameter(f"folder {missing.resolve().parent} does not exist", param_hint=str(missing))
        if (refused := opts.unwritable()) is not None:  # before loading anything: the run would be lost
            path, why = refused
            raise click.BadParameter(why, param_hint=str(path))
        assert info.pipeline is not None, f"frontend {name} registers no pipeline"
        pipe = info.pipeline(
            model or info.default_checkpoint,
            dtype=opts.dtype,
            backend=opts.backend,
            vram_budget=opts.vram_budget,
            weight_variant=weight_variant,
            **given,  # the frontend's checkpoint options
        )
        tool = click.get_current_context().command_path
        try:
            if mode.kind == "launch":
                from dif.cli_support import request_of
                from dif.kit.ranks import check_split, launch_ranks

                check_split(pipe, request_of(opts, images), mode.gpus)  # refused here, before any rank starts
                click.get_current_context().exit(launch_ranks(mode.gpus))
            if mode.kind == "rank":
                from dif.kit.ranks import run_rank_generate

                text = run_rank_generate(
                    mode, opts, pipe, version=info.revision, tool=tool, describe=describe_run, inputs=images
                )
            else:
                text = generate_image(
                    opts, pipe, version=info.revision, tool=tool, describe=describe_run, inputs=images
                )
        except UsageError as exc:
            if (flags := _flags_of(info, str(exc))) is None:
                raise
            raise click.BadParameter(str(exc), param_hint=flags) from None
        if text:
            click.echo(text)

    group.command("generate")(_apply(generate, options))

    @group.command("info")
    @click.argument("model", required=False, callback=_model_path)
    @click.option(
        "--variant",
        type=click.Choice(info.variants) if info.variants else None,
        help="Describe a published variant's architecture (its configs ship with the frontend) instead of MODEL.",
    )
    @click.option("--weight-variant", help="Weight files to read, e.g. fp16.")
    @click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
    def describe(model: Path | None, variant: str | None, weight_variant: str | None, as_json: bool) -> None:
        """Describe a checkpoint (default: the embedded model) or a published variant: configs, tensors, defaults."""
        from dif.cli_support import defaults_line, info_text

        if model is not None and variant is not None:
            raise click.UsageError("give MODEL or --variant, not both")
        assert info.describe is not None, f"frontend {name} registers no describe"
        title, data = info.describe(model, variant=variant, weight_variant=weight_variant)
        tool = click.get_current_context().command_path
        text = info_text(
            data, kind=f"{name}.info", tool=tool, as_json=as_json, title=title, defaults=defaults_line(data["defaults"])
        )
        click.echo(text)

    return group
