"""Golden files: the DiffIR text (`dif.serialize.text`) and the plan (the JSON of a `.difplan`) of the
embedded demo programs at a small size, so any change to a builder, an optimizer pass or the planner
shows up as a reviewable diff of tests/golden/.

Per program: NAME.difir.txt (as built), NAME.opt.difir.txt (after the core passes for GOLDEN_TARGET)
and NAME.plan.json (its plan within an ample budget); the FLUX.2 transformer also gets a plan one byte
short of keeping every weight resident (weight streaming). The target is a fixed CPU-like profile, not
this machine's, so the files are the same everywhere.

After a deliberate change, refresh them and review the diff:  python -m pytest tests/test_golden.py --update-golden
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen

from dif.ir.program import Program
from dif.passes import DEFAULT_PASSES, optimize, summarize
from dif.plan.plan import Plan, plan_to_dict
from dif.plan.planner import plan_program
from dif.serialize.text import print_program
from dif.target import RuntimeBudget, TargetProfile

GOLDEN = Path(__file__).resolve().parent / "golden"
REFRESH = "python -m pytest tests/test_golden.py --update-golden"
MAX_DIFF_LINES = 200

GOLDEN_TARGET = TargetProfile(
    backend="golden",
    device="cpu-like",
    arch="x86_64",
    compute_units=1,
    memory_bytes=1 << 34,
    dtypes=("f32", "f16", "bf16", "i32", "i64", "bool"),
    capabilities=("arena", "alias:reshape", "alias:split", "alias:concat", "view:*", "op:*"),
)
AMPLE = RuntimeBudget(free_memory_bytes=1 << 33)


@frozen
class Case:
    name: str
    build: Callable[[], Program]
    streamed: bool = False  # also plan it one byte short of keeping every weight resident


def _flux2_configs() -> Any:
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import load_configs

    return load_configs(DEFAULT_CHECKPOINT)


def _flux2_transformer() -> Program:
    from dif_frontend_flux2.model import build_transformer

    return build_transformer(_flux2_configs().transformer, batch=1, n_img=4, n_txt=8)


def _flux2_text_encoder() -> Program:
    from dif_frontend_flux2.text_encoder import build_text_encoder

    # taps (1, 2, 3) build 3 of the demo's 28 layers: every kind of node, a tenth of the text
    return build_text_encoder(_flux2_configs().text_encoder, batch=1, seq_len=8, taps=(1, 2, 3))


def _flux2_vae_decoder() -> Program:
    from dif_frontend_flux2.vae import build_vae_decoder

    return build_vae_decoder(_flux2_configs().vae, batch=1, latent_h=4, latent_w=4, from_packed=True)


def _krea2_denoiser() -> Program:
    from dif_frontend_krea2 import DEFAULT_CHECKPOINT
    from dif_frontend_krea2.config import load_configs
    from dif_frontend_krea2.model import build_denoiser

    return build_denoiser(load_configs(DEFAULT_CHECKPOINT).transformer, image_len=4, text_len=8)


CASES = (
    Case("flux2-transformer", _flux2_transformer, streamed=True),
    Case("flux2-text-encoder", _flux2_text_encoder),
    Case("flux2-vae-decoder", _flux2_vae_decoder),
    Case("krea2-denoiser", _krea2_denoiser),
)


def plan_json(plan: Plan) -> str:
    """The plan's `.difplan` document, sorted keys, laid out for diffs: a container of scalars only
    (a buffer, a decision, the schedule) on one line, every other one item per line."""

    def flat(value: Any) -> bool:
        items = value.values() if isinstance(value, dict) else value
        return not any(isinstance(v, dict | list) for v in items)

    def dump(value: Any, indent: int) -> str:
        if not isinstance(value, dict | list) or flat(value):
            return json.dumps(value, sort_keys=True, allow_nan=False)
        pad, inner = " " * indent, " " * (indent + 1)
        if isinstance(value, dict):
            body = [f"{inner}{json.dumps(k)}: {dump(value[k], indent + 1)}" for k in sorted(value)]
            return "{\n" + ",\n".join(body) + f"\n{pad}}}"
        return "[\n" + ",\n".join(f"{inner}{dump(v, indent + 1)}" for v in value) + f"\n{pad}]"

    return dump(plan_to_dict(plan), 0) + "\n"


@cache
def rendered(case_name: str) -> dict[str, str]:
    """file name -> expected text, for every golden file of one case."""
    case = next(c for c in CASES if c.name == case_name)
    program = case.build()
    optimized, decisions = optimize(program, target=GOLDEN_TARGET, passes=DEFAULT_PASSES)

    def plan(budget: RuntimeBudget) -> Plan:
        made = summarize(decisions, DEFAULT_PASSES, source="tests/test_golden.py")
        return plan_program(optimized, GOLDEN_TARGET, budget, decisions=made)

    ample = plan(AMPLE)
    texts = [print_program(program), print_program(optimized), plan_json(ample)]
    if case.streamed:
        short = plan(RuntimeBudget(free_memory_bytes=ample.binding.min_memory_bytes - 1))
        assert short.streamed, f"{case.name}: a budget one byte short streams nothing"
        texts.append(plan_json(short))
    return dict(zip(file_names(case), texts, strict=True))


def file_names(case: Case) -> list[str]:
    kinds = ["difir.txt", "opt.difir.txt", "plan.json"] + ["streamed.plan.json"] * case.streamed
    return [f"{case.name}.{kind}" for kind in kinds]


FILES = [(case.name, name) for case in CASES for name in file_names(case)]  # named without building anything


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden", default=False))


@pytest.mark.parametrize(("case", "name"), FILES, ids=[name for _, name in FILES])
def test_golden_file(case: str, name: str, update_golden: bool) -> None:
    expected = rendered(case)[name]
    path = GOLDEN / name
    if update_golden:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(expected, encoding="utf-8")
        return
    assert path.is_file(), f"tests/golden/{name} is missing; write it with: {REFRESH}"
    committed = path.read_text(encoding="utf-8")
    if committed != expected:
        diff = list(
            difflib.unified_diff(
                committed.splitlines(), expected.splitlines(), f"tests/golden/{name}", "current code", lineterm=""
            )
        )
        shown = diff[:MAX_DIFF_LINES] + (
            [f"... {len(diff) - MAX_DIFF_LINES} more diff lines"] * (len(diff) > MAX_DIFF_LINES)
        )
        pytest.fail(
            f"tests/golden/{name} differs from what the current code produces:\n"
            + "\n".join(shown)
            + f"\n\nIf the change is intended, refresh the golden files and review the diff: {REFRESH}",
            pytrace=False,
        )


def test_no_stale_golden_files(update_golden: bool) -> None:
    produced = {name for _, name in FILES}
    stale = sorted(p.name for p in GOLDEN.glob("*") if p.is_file() and p.name not in produced)
    if update_golden:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert stale == [], f"tests/golden/ holds files no case produces: {stale}; remove them with: {REFRESH}"


def test_golden_files_stay_small() -> None:
    total = sum(len(text.encode()) for case in CASES for text in rendered(case.name).values())
    assert total < 400_000, f"the golden files add up to {total} B; build the cases smaller"
