"""What image frontends share from dif-core: the pipeline base and its stages (dif.image_pipeline),
the click-free command bodies (dif.cli_support), the plugin hooks (dif.frontend.frontend_hooks)
and the writer of tiny random checkpoints (dif.testing.random_checkpoint)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from attrs import define, field

from dif.cli_support import ImageOptions, generate_image, info_text
from dif.dtypes import DType
from dif.errors import UsageError
from dif.frontend import SEED, FrontendInfo, SettingSpec, frontend_hooks, size_settings
from dif.image_pipeline import ImageRequest, TextToImagePipeline
from dif.media import read_png_metadata
from dif.plugins import add_commands, frontends, isolated_plugins, register_plugin
from dif.program_cache import ProgramCache
from dif.runstats import StageTimer
from dif.sched import flow_match_schedule
from dif.serialize.diftensor import load_tensors
from dif.telemetry import validate_document
from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight, script_main, write_diffusers_folder

GRID = (2, 3)  # latent tokens high, wide; one token is 8x8 pixels here


@define
class ToyPipeline(TextToImagePipeline):
    """Encodes a prompt as its length; denoising adds the conditioning; decoding paints it gray."""

    checkpoint: Any
    dtype: DType = DType.F32
    backend: str | None = None
    on_step: Any = None
    calls: list[str] = field(factory=list)
    _programs: ProgramCache = field(init=False)

    def __attrs_post_init__(self) -> None:
        self._programs = ProgramCache("interp")

    @property
    def native_size(self) -> int:
        return 40

    def resolve(self, req: ImageRequest, /) -> tuple[int, float, bool, list[str]]:
        guidance = 2.0 if req.guidance is None else req.guidance
        return req.steps or 3, guidance, guidance > 1, ["toy warning"]

    def generate(self, req: ImageRequest, /) -> Any:
        steps, guidance, cfg, warnings = self.resolve(req)
        timer = StageTimer()
        schedule = flow_match_schedule(steps)
        noise = np.zeros((1, GRID[0] * GRID[1], 4), np.float32)
        return self.run_stages(
            req,
            timer,
            noise=noise,
            schedule=schedule,
            guidance=guidance,
            cfg=cfg,
            size=self.size(req),
            grid=GRID,
            warnings=warnings,
            model="toy",
            flavour="plain",
        )

    def encode(self, prompt: str, /) -> float:
        self.calls.append(f"encode {prompt!r}")
        return float(len(prompt))

    def denoise(
        self,
        noise: np.ndarray,
        cond: float,
        uncond: float | None,
        schedule: Any,
        guidance: float,
        grid_h: int,
        grid_w: int,
        /,
    ) -> np.ndarray:
        self.calls.append(f"denoise uncond={uncond} grid={grid_h}x{grid_w}")
        return noise + cond

    def decode(self, latents: np.ndarray, grid_h: int, grid_w: int, /) -> np.ndarray:
        return np.full((grid_h * 8, grid_w * 8, 3), min(int(latents.max()), 255), np.uint8)


def test_run_stages_times_each_stage_and_records_the_settings() -> None:
    pipe = ToyPipeline(checkpoint=None)
    run = pipe.generate(ImageRequest("abcd", "no", steps=2, width=24, height=16, seed=5))
    assert pipe.calls == ["encode 'abcd'", "encode 'no'", "denoise uncond=2.0 grid=2x3"]
    assert list(run.timings) == ["encode", "denoise", "decode"]
    s = run.settings
    assert (s["steps"], s["guidance"], s["cfg"], s["seed"], s["width"], s["height"]) == (2, 2.0, True, 5, 24, 16)
    assert (s["model"], s["backend"], s["dtype"], s["negative_prompt"]) == ("toy", "interp", "f32", "no")
    assert list(s)[-1] == "flavour" and s["flavour"] == "plain" and run.warnings == ("toy warning",)
    assert run.pixels.shape == (16, 24, 3) and int(run.pixels[0, 0, 0]) == 4
    assert run.plan_peak_bytes == 0 and run.peak_rss_bytes > 0
    assert pipe.backend_name == "interp" and pipe.load_seconds == 0.0  # the toy prepares no programs
    off = ToyPipeline(checkpoint=None).generate(ImageRequest("x", "ignored", guidance=1.0))
    assert off.settings["cfg"] is False and off.settings["negative_prompt"] == ""


def test_the_base_pipeline_names_what_a_frontend_must_implement() -> None:
    base = TextToImagePipeline()
    with pytest.raises(NotImplementedError):
        base.encode("x")
    with pytest.raises(NotImplementedError):
        base.decode(np.zeros(1), 1, 1)


def _options(**over: Any) -> dict[str, Any]:
    base = {
        "prompt": "a fox",
        "negative_prompt": "",
        "init_noise": None,
        "save_latents": None,
        "backend": None,
        "dtype": "auto",
        "output": None,
        "as_json": False,
    }
    return {**base, **over}


def _settings(**over: Any) -> dict[str, Any]:
    return {"steps": 2, "guidance": None, "seed": None, "width": None, "height": None, **over}


def test_image_options_fill_seed_and_output_and_find_missing_folders(tmp_path: Path) -> None:
    opts = ImageOptions.parse("toy", _options(), _settings())
    assert 0 <= opts.seed < 2**32 and opts.output == Path(f"toy-{opts.seed}.png") and opts.started > 0
    assert opts.settings["seed"] == opts.seed and opts.settings["steps"] == 2
    assert opts.missing_folder() is None
    fixed = ImageOptions.parse("toy", _options(output=tmp_path / "a.png"), _settings(seed=9))
    assert fixed.seed == 9 and fixed.output == tmp_path / "a.png"
    gone = tmp_path / "no" / "l.safetensors"
    opts = ImageOptions.parse("toy", _options(output=tmp_path / "a.png", save_latents=gone), _settings())
    assert opts.missing_folder() == gone


def test_generate_image_writes_the_png_and_prints_lines_or_json(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "fox.png"
    opts = ImageOptions.parse("toy", _options(output=out), _settings(seed=3, width=24, height=16))
    pipe = ToyPipeline(checkpoint=None)
    text = generate_image(
        opts, pipe, version="9.9", tool="dif toy generate", describe=lambda s: f"{s['model']} ({s['flavour']})"
    )
    assert capsys.readouterr().err == "warning: toy warning\n"
    assert text.startswith(f"wrote {out}  (24x16, 2 steps, CFG 2.0, seed 3)") and "model toy (plain), f32" in text
    assert pipe.on_step is not None  # the progress bar
    meta = read_png_metadata(out)
    assert meta["size"] == (24, 16) and meta["dif"]["generator"] == "dif-frontend-toy 9.9"
    opts = ImageOptions.parse("toy", _options(output=out, as_json=True), _settings(seed=3))
    doc = json.loads(generate_image(opts, ToyPipeline(checkpoint=None, dtype=DType.BF16), version="9.9",
                                    tool="dif toy generate", describe=str))  # fmt: skip
    validate_document(doc)
    assert doc["kind"] == "toy.generate" and doc["provenance"]["tool"] == "dif toy generate"
    settings = doc["data"]["settings"]
    assert settings["dtype"] == "bf16" and settings["width"] == settings["height"] == 40  # the native size
    assert [e["name"] for e in doc["events"]] == ["stage.encode", "stage.denoise", "stage.decode", "stage.save"]


def test_info_text_lines_and_document() -> None:
    part = {"tensors": 2, "bytes": 3_000_000, "dtypes": ["BF16"], "from": "x"}
    data = {"path": "/m", "transformer": {"blocks": 1, **part}, "text_encoder": part, "vae": part, "tokenizer": None}
    text = info_text(data, kind="toy.info", tool="dif toy info", as_json=False, title="toy model", defaults="4 steps")
    lines = text.split("\n")
    assert lines[:3] == ["toy model", "  path /m", "  transformer: blocks 1; 2 tensors, 3.0 MB BF16"]
    assert lines[-2:] == ["  defaults: 4 steps", "  tokenizer: missing"]
    doc = json.loads(info_text(data, kind="toy.info", tool="dif toy info", as_json=True, title="", defaults=""))
    validate_document(doc)
    assert doc["kind"] == "toy.info" and doc["data"] == data


def test_frontend_hooks_register_the_info_and_add_the_named_command() -> None:
    info = FrontendInfo(name="toyfront", description="a toy", detect=lambda path: False)
    plugin = types.ModuleType("toyfront_plugin")
    plugin.register_frontends, plugin.register_commands = frontend_hooks(info, "json:dumps")  # type: ignore[attr-defined]
    added: list[Any] = []
    with isolated_plugins(""):
        register_plugin(plugin, "toyfront")
        assert frontends()["toyfront"] is info
        add_commands(types.SimpleNamespace(add_command=added.append))
    assert added == [json.dumps]


def test_write_diffusers_folder_lays_out_components_by_library(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    for name, text in (("vocab.json", "{}"), ("merges.txt", "#"), ("tokenizer_config.json", '{"a": 1, "b": "é"}')):
        (tok / name).write_text(text)
    shapes = {"transformer": {"proj.weight": (4, 3), "proj.bias": (4,)}, "text_encoder": {"embed_tokens.weight": (5,)}}
    index = {"transformer": ["diffusers", "T"], "text_encoder": ["transformers", "E"]}
    components = {name: ({"_class_name": name}, s) for name, s in shapes.items()}

    def tensor_for(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return random_weight(name_rng(name), name, shape).astype(np.float32)

    line = write_diffusers_folder(
        tmp_path / "out",
        index,
        components,
        tensor_for,
        scheduler={"shift": 3.0},
        tokenizer=tok,
        tokenizer_files=("vocab.json", "merges.txt"),
        tokenizer_config={"b": "ü", "c": 2},
    )
    out = tmp_path / "out"
    assert line.startswith(f"wrote {out}: ") and "transformer 0.00 MB, text_encoder 0.00 MB" in line
    weights, meta = load_tensors(out / "transformer" / "diffusion_pytorch_model.safetensors")
    assert sorted(weights) == ["proj.bias", "proj.weight"] and meta == {"format": "pt"}
    np.testing.assert_array_equal(weights["proj.weight"], tensor_for("proj.weight", (4, 3)))
    assert (out / "text_encoder" / "model.safetensors").is_file()
    assert json.loads((out / "model_index.json").read_text()) == index
    assert json.loads((out / "scheduler" / "scheduler_config.json").read_text()) == {"shift": 3.0}
    config = (out / "tokenizer" / "tokenizer_config.json").read_text()
    assert json.loads(config) == {"a": 1, "b": "ü", "c": 2} and "ü" in config  # updated, not ASCII-escaped
    assert (out / "tokenizer" / "merges.txt").read_text() == "#"
    # the same name draws the same values; an embedding table is unit normal, a matrix fan-in scaled
    assert np.array_equal(random_weight(name_rng("a"), "a", (3,)), random_weight(name_rng("a"), "a", (3,)))
    big = random_weight(name_rng("w"), "w", (64, 400))
    table = random_weight(name_rng("e"), "x.embed_tokens.weight", (64, 400))
    assert 0.03 < big.std() < 0.07 and 0.8 < table.std() < 1.2


def test_script_main_needs_tokenizer_files(tmp_path: Path, capsys: Any) -> None:
    made: list[tuple[Path, Path]] = []

    def run(*argv: str) -> int:
        return script_main(
            list(argv),
            description="d",
            default_out=tmp_path / "o",
            default_tokenizer=tmp_path,
            make=lambda out, tok: made.append((out, tok)),
        )

    assert run() == 2 and "no Qwen tokenizer files" in capsys.readouterr().err and made == []
    (tmp_path / "vocab.json").write_text("{}")
    assert run("elsewhere") == 0 and made == [(Path("elsewhere"), tmp_path)]


def test_param_shapes_of_programs() -> None:
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder("p")
    x = b.input("x", (2, 3), "f32")
    b.output(b.emit("linear", x, b.param("w", (4, 3), "f32")))
    assert param_shapes(b.build()) == {"w": (4, 3)}


def _toy_frontend(tmp_path: Path, made: list[dict[str, Any]]) -> FrontendInfo:
    def pipeline(path: Path, **options: Any) -> ToyPipeline:
        made.append({"path": path, **options})
        return ToyPipeline(checkpoint=path)

    def describe(path: Path | None, *, variant: str | None, weight_variant: str | None) -> tuple[str, dict[str, Any]]:
        part = {"blocks": 1}
        defaults = {"steps": TOY.default("steps", "fast"), "guidance": 0.0, "cfg": False, "size": 40, "dtype": "f32"}
        data = {"path": str(path), "transformer": part, "text_encoder": part, "vae": part, "tokenizer": None}
        return f"toy {variant or 'checkpoint'}", {**data, "defaults": defaults}

    seen: list[dict[str, Any]] = []

    def validate(settings: dict[str, Any]) -> dict[str, Any]:
        seen.append(dict(settings))
        return settings

    made.append({"validated": seen})
    return attrs.evolve(TOY, pipeline=pipeline, describe=describe, validate=validate, default_checkpoint=tmp_path)


TOY = FrontendInfo(
    name="toy",
    description="a toy",
    detect=lambda path: True,
    variants=("small", "large"),
    settings=(
        SettingSpec("steps", None, "Denoising steps", minimum=1, by_kind={"fast": 2, "slow": 30}),
        SettingSpec(
            "guidance", None, "CFG scale", minimum=0.0, maximum=9.0, kind=float, flags=("--guidance", "--cfg-scale")
        ),
        *size_settings("Image {} in pixels"),
        SEED,
    ),
    revision="9.9",
)


def test_the_builder_makes_options_and_help_from_the_frontend_settings(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dif.kit.commands import image_commands

    made: list[dict[str, Any]] = []
    info = _toy_frontend(tmp_path, made)
    group = image_commands(info, help="Toy.", model_help="A toy folder.", describe_run=lambda s: s["model"])
    generate = group.commands["generate"]
    options = {p.name: p for p in generate.params}
    for spec in info.settings:  # one option per setting: its flags, its help, no click default
        option = options[spec.name]
        assert option.help == spec.help and option.default is None
        assert set(option.opts) == set(spec.flags or (f"--{spec.name}",))
    assert options["steps"].help == "Denoising steps (default: 2 fast, 30 slow)"
    assert options["width"].help == "Image width in pixels (default: the checkpoint's native size)"
    assert options["seed"].help.startswith("Noise seed for the --rng generator; -1 draws a fresh one")
    common = {"prompt", "negative_prompt", "model", "weight_variant", "init_noise", "save_latents", "backend"}
    common |= {"dtype", "vram_budget", "output", "as_json", "check_finite", "allow_nonfinite_weights"}
    common |= {"ref_images", "init_image", "strength", "mask", "batch", "kv_cache"}  # dif.image_pipeline.IMAGE_INPUTS
    common |= {"preview", "preview_every"}  # dif.preview
    common |= {"gpus"}  # dif.kit.ranks: generate --gpus N
    assert common | {s.name for s in info.settings} == set(options)

    runner = CliRunner()
    out = tmp_path / "toy.png"
    args = ["-p", "fox", "--cfg-scale", "1.5", "-W", "24", "-H", "16", "--seed", "4", "-o", str(out)]
    result = runner.invoke(group, ["generate", *args, "--dtype", "bf16", "--vram-budget", "1GB"])
    assert result.exit_code == 0, result.output
    assert made[-1] == {
        "path": tmp_path,
        "dtype": "bf16",
        "backend": None,
        "vram_budget": 10**9,
        "weight_variant": None,
    }
    validated = made[0]["validated"]
    assert validated == [{"steps": None, "guidance": 1.5, "width": 24, "height": 16, "seed": 4}]  # resolve_settings
    assert read_png_metadata(out)["dif"]["guidance"] == 1.5 and read_png_metadata(out)["size"] == (24, 16)
    bad = runner.invoke(group, ["generate", "-p", "x", "--guidance", "10", "-o", str(out)])
    assert bad.exit_code == 2 and "'--guidance' / '--cfg-scale'" in bad.output and "0.0<=x<=9.0" in bad.output

    shown = runner.invoke(group, ["info", "--variant", "large"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("toy large\n") and "  defaults: 2 steps, no CFG, 40x40, f32" in shown.output
    assert runner.invoke(group, ["info", "--variant", "huge"]).exit_code == 2  # the registered variants only
    assert runner.invoke(group, ["info", str(tmp_path), "--variant", "large"]).exit_code == 2


def test_setting_specs_derive_defaults_and_help_and_check_values() -> None:
    steps = TOY.setting("steps")
    assert (steps.default_for("fast"), steps.default_for("slow"), steps.default_for(None)) == (2, 30, None)
    assert TOY.defaults("slow")["steps"] == 30 and TOY.default("steps", "fast") == 2
    assert steps.check("toy", "7") == 7 and steps.check("toy", None) is None
    with pytest.raises(UsageError, match="below the minimum"):
        steps.check("toy", 0)
    with pytest.raises(UsageError, match="unknown setting 'cfg'"):
        TOY.setting("cfg")
    resolved = TOY.resolve_settings({"width": "48"})
    assert resolved == {"steps": None, "guidance": None, "width": 48, "height": None, "seed": None}
