"""The physical-format registry: legality comes from TargetProfile lists, never device names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dif.errors import PluginError, UsageError
from dif.formats import (
    FORMATS,
    TENSOR_CORE_FORMATS,
    FormatRegistry,
    PhysicalFormat,
    Usage,
    assess,
    formats_table,
    legal_on,
    usage_on,
)
from dif.target import TargetProfile

CPU_LIKE = TargetProfile(backend="cpu", device="host", dtypes=("f32", "f16", "bf16", "f8e4m3", "i8", "u8"))
FP8_GPU = TargetProfile(
    backend="fake",
    device="whatever",
    dtypes=("f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "u8"),
    tensor_core_formats=("bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "int8"),
)

CORE_FORMATS = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "int8", "int4-group", "nvfp4")


def test_core_formats_are_registered():
    names = [f.name for f in FORMATS]
    for name in CORE_FORMATS:
        assert name in names
    assert FORMATS.get("int4-group").group_size == 128
    assert FORMATS.get("int8").scale == "per-channel"


def test_every_required_tensor_core_format_is_in_the_vocabulary():
    for fmt in FORMATS:
        for tc in fmt.requires_tensor_core:
            assert tc in TENSOR_CORE_FORMATS, (fmt.name, tc)


def test_fp8_needs_the_tensor_core_format_listed_by_the_profile():
    ok, reason = legal_on("fp8-e4m3", CPU_LIKE)
    assert not ok
    assert "tensor-core format 'fp8-e4m3'" in reason
    ok, reason = legal_on("fp8-e4m3", FP8_GPU)
    assert ok, reason


def test_legality_ignores_the_device_name():
    renamed = TargetProfile(backend="cuda", device="NVIDIA H200", arch="sm_90", dtypes=CPU_LIKE.dtypes)
    assert legal_on("fp8-e4m3", renamed) == legal_on("fp8-e4m3", CPU_LIKE)


def test_missing_dtype_is_the_reason():
    f32_only = TargetProfile(backend="x", device="y", dtypes=("f32",))
    ok, reason = legal_on(FORMATS.get("bf16"), f32_only)
    assert not ok
    assert "dtype 'bf16'" in reason and "f32" in reason


def test_capability_requirement():
    fmt = PhysicalFormat(
        name="needs-cap",
        description="d",
        storage_dtype="u8",
        bits=4,
        usage=Usage.HOOK_ONLY,
        usage_reason="r",
        requires_capabilities=("int4-unpack",),
    )
    assert legal_on(fmt, CPU_LIKE)[0] is False
    with_cap = TargetProfile(backend="x", device="y", capabilities=("int4-unpack",))
    assert legal_on(fmt, with_cap)[0] is True


def test_verdicts_and_searchable():
    rows = {v.format: v for v in formats_table(FP8_GPU)}
    assert rows["fp8-e4m3"].legal and rows["fp8-e4m3"].usage is Usage.HOOK_ONLY  # fp8 units, no fp8 code
    assert not rows["fp8-e4m3"].searchable
    assert not rows["fp8-e5m2"].searchable  # legal but hook only
    assert rows["fp8-e5m2"].legal
    assert not rows["nvfp4"].legal
    assert rows["int8"].legal and rows["int8"].usage is Usage.HOOK_ONLY and not rows["int8"].searchable
    as_dict = assess("bf16", FP8_GPU).to_dict()
    assert as_dict["usage"] == "search candidate"
    assert set(as_dict) == {"format", "legal", "reason", "usage", "usage_reason", "searchable", "executes"}


def test_registry_duplicates_and_unknown_names():
    reg = FormatRegistry()
    fmt = FORMATS.get("bf16")
    reg.register(fmt)
    reg.register(fmt)  # the same definition again is fine (plugins re-registering)
    other = PhysicalFormat(
        name="bf16", description="other", storage_dtype="bf16", bits=16, usage="hook only", usage_reason="r"
    )
    with pytest.raises(PluginError, match="already registered"):
        reg.register(other)
    with pytest.raises(UsageError, match="unknown physical format 'nope'"):
        reg.get("nope")
    with pytest.raises(PluginError):
        reg.register("bf16")  # type: ignore[arg-type]


def test_usage_depends_on_what_the_backend_implements():
    int8 = FORMATS.get("int8")
    assert int8.implemented_by == "format:int8"
    usage, why = usage_on(int8, CPU_LIKE)
    assert usage is Usage.HOOK_ONLY
    assert "backend 'cpu' has no implementation" in why and "'format:int8'" in why and "search candidate" in why
    implements = TargetProfile(backend="cuda", device="d", dtypes=("i8",), capabilities=("format:int8",))
    assert usage_on(int8, implements) == (Usage.SEARCH_CANDIDATE, int8.usage_reason)
    assert assess("int8", implements).usage is Usage.SEARCH_CANDIDATE
    assert usage_on("bf16", CPU_LIKE)[0] is Usage.SEARCH_CANDIDATE  # needs no backend code: as registered
    plugin_policy = PhysicalFormat(
        name="int6", description="d", storage_dtype="u8", bits=6, usage="execution policy", usage_reason="r"
    )
    assert plugin_policy.implemented_by == "format:int6"  # execution policies default to needing a backend


def test_fp8_is_a_search_candidate_only_where_a_backend_implements_it():
    """fp8 matrix units alone do not make fp8-e4m3 searchable: it needs a scaled-cast pass and an fp8
    GEMM, so it stays hook only until a backend lists 'format:fp8-e4m3' among its capabilities."""
    fp8 = FORMATS.get("fp8-e4m3")
    assert fp8.usage is Usage.SEARCH_CANDIDATE and fp8.implemented_by == "format:fp8-e4m3"
    usage, why = usage_on(fp8, FP8_GPU)
    assert usage is Usage.HOOK_ONLY
    assert "backend 'fake' has no implementation" in why and "'format:fp8-e4m3'" in why
    assert "search candidate" in why  # says what it becomes where implemented
    implements = TargetProfile(
        backend="fake",
        device="whatever",
        dtypes=FP8_GPU.dtypes,
        tensor_core_formats=FP8_GPU.tensor_core_formats,
        capabilities=("format:fp8-e4m3",),
    )
    verdict = assess(fp8, implements)
    assert verdict.usage is Usage.SEARCH_CANDIDATE and verdict.searchable


def test_only_formats_needing_no_backend_code_are_searchable_without_a_declaration():
    """No core search candidate that needs backend code may skip `implemented_by`: the plain casts
    (fp32, bf16, fp16) are the only ones every backend listing the dtype can run as-is."""
    undeclared = {f.name for f in FORMATS if f.usage is not Usage.HOOK_ONLY and not f.implemented_by}
    assert undeclared <= {"fp32", "bf16", "fp16"}
    searchable = {v.format for v in formats_table(FP8_GPU) if v.searchable}
    assert searchable == {"fp32", "bf16", "fp16"}
    cpu = {v.format for v in formats_table(CPU_LIKE) if v.searchable}
    assert cpu == {"fp32", "bf16", "fp16"}


def test_docs_list_every_core_format_with_its_usage_and_implementer():
    """docs/formats.md's physical-format table matches the registry: usage and `implemented_by`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text()
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `([a-z0-9-]+)` \| ([a-z ]+) \| ([^|]+) \|", text, re.M)}
    for name in CORE_FORMATS:
        fmt = FORMATS.get(name)
        assert name in rows, f"docs/formats.md has no row for physical format {name}"
        usage, implemented_by = rows[name]
        assert usage == fmt.usage.value, f"docs/formats.md: {name} usage"
        expected = f"`{fmt.implemented_by}`" if fmt.implemented_by else "—"
        assert implemented_by.strip().startswith(expected), f"docs/formats.md: {name} implemented_by"
