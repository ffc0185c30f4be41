"""cuDNN fused attention (cudnn frontend's SDPA graph) for one `sdpa` node: fp16/bf16, grouped-query
heads, our [B, S, H, D] layout given to cuDNN as strides of its [B, H, S, D] view (tokens may be further
apart than H * D: views inside wider buffers, `dif.plan.views`). Executing it is graph-capturable.

A cuDNN graph does not hold device pointers (each execution gets a variant pack keyed by tensor uid),
and building one (operation graph, heuristics, plan, often a runtime-compiled kernel) costs from tens of
milliseconds to a second. So `CudnnContext.shared_graph` builds one graph per distinct problem and every
node of that problem (the 36 layers of a text encoder, the blocks of a DiT) executes it with its own
pack; executions are ordered on the backend's one stream, so every graph shares ONE workspace of
`WORKSPACE_BYTES` (part of the memory the backend reserves outside the plans). A plan needing more, up to
`LARGE_WORKSPACE_BYTES`, runs in the large workspace (`LargeWorkspace`), one buffer for all such graphs sized to
the largest of them: the convolutions of a VAE at 1024^2 want their input and output's size (NCHW to NHWC and
back) and ran five to ten times slower on the plans that fit 256 MiB. Plans needing more than that are
deselected, and only a problem no plan of which fits gets a workspace of its own (said in its choice). The built
plan is serialized into the tuning store (`tuning.Choices.write_artifact`) and a later process
deserializes it instead of building, as long as the plan choice it was built for is still the one
`Choices` makes.

Eligibility (else the NVRTC flash kernel runs): fp16/bf16, D == Dv, D a multiple of 8 and at most 256,
and causal only when Sq == Skv (cuDNN's causal mask is top-left aligned). A key mask without causal is
met by reordering: the lowering gathers each batch row's attended keys and values to the front of a scratch
copy and cuDNN's padding mask attends over the first `seq_lens` of them (a score bias makes cuDNN take a
slower kernel). With causal, or where cuDNN refuses the padding mask, the mask reaches cuDNN as an additive
score bias [B, 1, 1, Skv] (`key_bias`; [B, 1, Sq, Skv] where cuDNN refuses to broadcast over the queries),
filled from the mask on every run. Either way a kernel then zeroes the query rows whose keys are all masked
(kernels/attention.cu).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from attrs import frozen

from dif.dtypes import DType
from dif.errors import BackendError

if TYPE_CHECKING:
    from dif_backend_cuda.tuning import Choices


WORKSPACE_BYTES = 256 << 20
"""The workspace all cuDNN graphs share. One per graph added up to gigabytes for a VAE's convolutions."""
LARGE_WORKSPACE_BYTES = 2 << 30
"""The most workspace a plan may take from `LargeWorkspace`: the FLUX.2 VAE decoder's largest convolution at
1024^2 (256 -> 256 channels, 3x3) wants 1 GiB for its fast plan; one at 2048^2 would want 4 GiB and takes a plan
within this instead."""
LARGE_HEADROOM_BYTES = 1 << 30
"""Device memory a problem's plans leave free beyond the large workspace: with less free than that plus
`LARGE_WORKSPACE_BYTES` (besides what the large workspace has reserved and not yet allocated), its plans are kept
within the shared workspace, as a card whose memory the programs fill needs."""

REFUSED = b"refused\n"  # a stored artifact saying cuDNN refused the problem, then why

UIDS = {
    "q": 1, "k": 2, "v": 3, "o": 4, "bias": 5, "x": 6, "w": 7, "y": 8, "seq_q": 9, "seq_kv": 10,
    "stats": 11, "do": 12, "dq": 13, "dk": 14, "dv": 15,
    "descale_q": 16, "descale_k": 17, "descale_v": 18, "scale_o": 19, "descale_s": 20, "scale_s": 21,
    "amax_s": 22, "amax_o": 23,
}  # fmt: skip
"""The uid of each graph tensor by name: what a variant pack is keyed by, and what survives serialization."""


class LargeWorkspace:
    """The workspace of the plans that need more than the shared one: one buffer, allocated when a graph first
    executes at the size of the largest need reserved until then (a program's graphs are all built before any of
    them runs), and never moved after (captured CUDA graphs hold its address). A need reserved after that which
    does not fit starts a new buffer (`CudnnContext.workspace`); each graph keeps the one it was given alive."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.memory: Any = None

    def reserve(self, nbytes: int) -> bool:
        """Make room for `nbytes`; False once allocated smaller than that."""
        if self.memory is None:
            self.nbytes = max(self.nbytes, nbytes)
            return True
        return nbytes <= self.nbytes

    @property
    def ptr(self) -> int:
        if self.memory is None:
            import cupy

            self.memory = cupy.cuda.Memory(self.nbytes)
        return int(self.memory.ptr)


@frozen
class SharedGraph:
    """A built cuDNN graph with its workspace and how its plan was chosen."""

    graph: Any
    workspace: Any
    choice: str

    @staticmethod
    def pack(pointers: Mapping[str, int]) -> dict[int, int]:
        """The variant pack binding the graph's tensors (by name) to `pointers`."""
        return {UIDS[name]: ptr for name, ptr in pointers.items()}


class CudnnContext:
    """One cuDNN handle bound to the backend's stream, the graphs built so far (one per distinct
    problem, `shared_graph`) and the execution plan chosen per graph (`build_fastest`, through
    `tuning.Choices`)."""

    def __init__(
        self, stream: Any, choices: Callable[[str], Choices] | None = None, workspace_bytes: int = WORKSPACE_BYTES
    ) -> None:
        import cudnn
        import cupy

        self.lib = cudnn
        self.stream = stream
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=stream.ptr)
        self.version = str(cudnn.backend_version())
        # `choices(version)`: the backend's store of plan choices for this cuDNN version (None: cuDNN's own)
        self.choices = choices(f"cudnn {self.version}") if choices is not None else None
        self._graphs: dict[tuple[Any, ...], SharedGraph | Exception] = {}
        self.workspace_bytes = workspace_bytes
        self._workspace: Any = None  # allocated at the first graph, never moved (captured graphs hold it)
        self._large = LargeWorkspace()
        self.free_bytes: Callable[[], int] = lambda: int(cupy.cuda.runtime.memGetInfo()[0])

    def workspace_limit(self) -> int:
        """The most workspace a new problem's plans may need: `LARGE_WORKSPACE_BYTES` while the device has room
        for it (`LARGE_HEADROOM_BYTES`), else the shared workspace's size. Two values only: the limit is part of
        the problem's key in the tuning store."""
        pending = self._large.nbytes if self._large.memory is None else 0
        room = self.free_bytes() - pending - LARGE_HEADROOM_BYTES
        return LARGE_WORKSPACE_BYTES if room >= LARGE_WORKSPACE_BYTES else self.workspace_bytes

    def workspace(self, nbytes: int) -> Any:
        """Where a plan needing `nbytes` works (anything with a `ptr`): the shared workspace when it fits, else
        the large one up to `LARGE_WORKSPACE_BYTES`, else a buffer of its own."""
        import cupy

        if nbytes > LARGE_WORKSPACE_BYTES:
            return cupy.cuda.Memory(nbytes)
        if nbytes > self.workspace_bytes:
            if not self._large.reserve(nbytes):
                self._large = LargeWorkspace()
                self._large.reserve(nbytes)
            return self._large
        if self._workspace is None:
            self._workspace = cupy.cuda.Memory(self.workspace_bytes)
        return self._workspace

    def shared_graph(
        self, key: tuple[Any, ...], build: Callable[[int | None], Any], pointers: Mapping[str, int]
    ) -> tuple[SharedGraph, bool]:
        """(the built graph of problem `key`, whether an earlier node built it). `build(limit)` makes the
        graph (tensors with their `UIDS`, validated, execution plans created and those needing more workspace
        than `limit` deselected, support checked); its plan is then chosen (timed on `pointers` when tuning is
        on) or, when this choice was built before, read from the tuning store. `limit` is `workspace_limit()`;
        without a plan within it the graph is built again without one. A problem cuDNN refused is refused again
        for the next node without a second attempt."""
        known = self._graphs.get(key)
        if isinstance(known, Exception):
            raise known
        if known is not None:
            return known, True
        limit = self.workspace_limit()
        # in the store the limit is part of the problem: its plan list, so a stored plan or plan index, depends on
        # it (stores written before it was, under the 256 MiB limit, hold the slow plans that limit left)
        stored_key = (*key, f"workspace<={limit}")
        stored = self._stored_graph(stored_key)
        if stored is not None:
            self._graphs[key] = stored
            if isinstance(stored, Exception):
                raise stored
            return stored, False
        try:
            try:
                graph = build(limit)
            except Exception:  # noqa: BLE001 - no plan within the limit: any plan, its own workspace
                graph = build(None)
        except Exception as exc:
            self._graphs[key] = exc
            if self.choices is not None:  # the same library on the same device refuses it again: say so at once
                self.choices.write_artifact(stored_key, REFUSED + f"{type(exc).__name__}: {exc}".encode()[:2000])
            raise
        workspace, choice, index, count = self.build_fastest(graph, SharedGraph.pack(pointers), stored_key)
        built = self._graphs[key] = SharedGraph(graph, workspace, choice)
        if self.choices is not None and self.choices.mode != "on":
            try:
                blob = bytes(graph.serialize(as_bytes=True))
            except Exception:  # noqa: BLE001 - a plan the frontend cannot serialize is built again next time
                return built, False
            self.choices.write_artifact(stored_key, f"{count} {index}\n".encode() + blob)
        return built, False

    def _stored_graph(self, key: tuple[Any, ...]) -> SharedGraph | Exception | None:
        """The graph of `key` deserialized from the tuning store, when a plan is stored for the choice
        `Choices` makes now, or the error cuDNN gave when it refused the problem before. Never while tuning:
        that builds (and times) everything again."""
        if self.choices is None or self.choices.mode == "on":
            return None
        payload = self.choices.read_artifact(key)
        if payload is None:
            return None
        if payload.startswith(REFUSED):
            return BackendError(f"cuDNN refused it before: {payload[len(REFUSED) :].decode(errors='replace')}")
        header, _, blob = payload.partition(b"\n")
        try:
            count, index = (int(v) for v in header.split())
        except ValueError:
            return None
        if count > 1:

            def no_timing() -> int:
                raise AssertionError("a stored choice is never timed")

            chosen, how = self.choices.choose(key, count, no_timing)
        else:
            chosen, how = 0, "heuristic"
        if chosen != index:
            return None  # built for another choice (tuned since): build the chosen plan

        try:
            graph = self.lib.pygraph(handle=self.handle)
            graph.deserialize(self.handle, blob)
            workspace = self.workspace(int(graph.get_workspace_size()))
        except Exception:  # noqa: BLE001 - another frontend's format or a damaged plan: build it again
            return None
        summary = f"plan {index + 1} of {count} ({how})" if count > 1 else "heuristic's first plan"
        return SharedGraph(graph, workspace, f"{summary}, from the plan cache")

    def build_fastest(self, graph: Any, pack: dict[Any, int], key: tuple[Any, ...]) -> tuple[Any, str, int, int]:
        """Build `graph` (execution plans already created) with the plan `tuning.Choices` picks for `key`:
        a stored choice, else (tuning on) the fastest candidate timed on its own buffers, else cuDNN's own
        first choice; returns (workspace, summary, the index chosen (0: cuDNN's own), the plan count).
        Building a plan at an index makes it the one `execute` runs; a stored index that no longer builds
        falls back to cuDNN's choice."""

        count = 0
        try:
            count = int(graph.get_execution_plan_count()) if self.choices is not None else 0
            if count > 1:
                assert self.choices is not None
                index, how = self.choices.choose(key, count, lambda: self._fastest_plan(graph, pack, count))
                if how != "heuristic":
                    graph.build_plan_at_index(index)
                    workspace = self.workspace(int(graph.get_workspace_size()))
                    return workspace, f"plan {index + 1} of {count} ({how})", index, count
        except Exception:  # noqa: BLE001 - an older frontend, or no plan could run: cuDNN's own choice
            self.stream.synchronize()
        graph.build_plans()
        return self.workspace(int(graph.get_workspace_size())), "heuristic's first plan", 0, count

    def _fastest_plan(self, graph: Any, pack: dict[Any, int], count: int) -> int:
        """Every plan built once, then timed by index (a plan that did not build fails there and is dropped)."""
        import cupy

        from dif_backend_cuda.tuning import fastest

        graph.build_plans(self.lib.build_plan_policy.ALL)
        need = 1
        for index in range(count):
            try:
                need = max(need, int(graph.get_workspace_size_plan_at_index(index)))
            except Exception:  # noqa: BLE001 - not built
                continue
        scratch = cupy.cuda.Memory(need)

        def run(index: int) -> None:
            graph.execute_plan_at_index(pack, scratch.ptr, index, handle=self.handle)

        return fastest(run, count, self.stream)[0]


class GraphStep:
    """A step that executes its problem's shared cuDNN graph with its own node's variant pack."""

    kind = "cudnn"

    def bind(self, ctx: CudnnContext, key: tuple[Any, ...], build: Callable[[int | None], Any],
             pointers: Mapping[str, int]) -> None:  # fmt: skip
        """The graph of `key` (built by `build` unless an earlier node built it) bound to `pointers`."""
        self.ctx = ctx
        self.built, shared = ctx.shared_graph(key, build, pointers)
        self.pack = SharedGraph.pack(pointers)
        self.choice = f"{self.built.choice}{', graph shared' if shared else ''}"

    def __call__(self, stream: Any) -> None:
        self.built.graph.execute(self.pack, self.built.workspace.ptr, handle=self.ctx.handle)


def padding_mask(cudnn: Any, graph: Any, b: int) -> dict[str, Any]:
    """The SDPA arguments of cuDNN's padding mask: int32 [B] query and key lengths (`seq_q`, `seq_kv`)."""
    lens = {
        f"seq_len_{name[4:]}": graph.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1],
                                            data_type=cudnn.data_type.INT32, uid=UIDS[name])
        for name in ("seq_q", "seq_kv")
    }  # fmt: skip
    return {**lens, "use_padding_mask": True}


def eligible(dtype: DType, d: int, dv: int, sq: int, skv: int, causal: bool) -> str:
    """'' when cuDNN can run this attention, else the reason it cannot."""
    if dtype not in (DType.F16, DType.BF16):
        return f"dtype {dtype.value} (cuDNN SDPA takes fp16/bf16)"
    if d != dv or d % 8 or d > 256:
        return f"head dims q/k {d}, v {dv}"
    if causal and sq != skv:
        return "causal with Sq != Skv"
    return ""


class CudnnSdpa(GraphStep):
    """One `sdpa` node on cuDNN: the shared graph of its problem and the node's own variant pack."""

    def __init__(
        self,
        ctx: CudnnContext,
        dtype: DType,
        b: int,
        sq: int,
        skv: int,
        hq: int,
        hkv: int,
        d: int,
        q: int,
        k: int,
        v: int,
        o: int,
        scale: float,
        causal: bool,
        token_strides: list[int],
        key_bias: int = 0,
        bias_rows: int = 1,
        seq_lens: int = 0,
        stats: int = 0,
    ) -> None:
        qt, kt, vt, ot = token_strides  # elements between tokens: h * d, or more for a view in a wider buffer
        padded = bool(seq_lens)  # int32 [2, B] at seq_lens: query and key lengths (cuDNN's padding mask)
        key = ("sdpa", dtype, b, sq, skv, hq, hkv, d, scale, causal, bool(key_bias), bias_rows, padded, *token_strides)
        key += ("stats",) if stats else ()  # fp32 [B, H, Sq] at `stats`: the log-sum-exp rows (`sdpa_stats`)

        def build(limit: int | None) -> Any:
            cudnn = ctx.lib
            g, dt = half_graph(ctx, dtype)
            fp32 = cudnn.data_type.FLOAT

            def bshd(name: str, s: int, h: int, t: int) -> Any:
                return g.tensor(name=name, dim=[b, h, s, d], stride=[s * t, d, t, 1], data_type=dt, uid=UIDS[name])

            qkv = {"q": bshd("q", sq, hq, qt), "k": bshd("k", skv, hkv, kt), "v": bshd("v", skv, hkv, vt)}
            kwargs = {**qkv, "name": "sdpa", "attn_scale": scale, "use_causal_mask": causal}
            if key_bias:  # [B, 1, bias_rows, Skv] added to every head's (and, with 1 row, every query's) scores
                n = bias_rows * skv
                kwargs["bias"] = g.tensor(
                    name="bias", dim=[b, 1, bias_rows, skv], stride=[n, n, skv, 1], data_type=dt, uid=UIDS["bias"]
                )
            if padded:
                kwargs.update(padding_mask(cudnn, g, b))
            try:
                out, lse = g.sdpa(generate_stats=bool(stats), **kwargs)
            except TypeError:  # older frontends spell it is_inference
                out, lse = g.sdpa(is_inference=not stats, **kwargs)
            out.set_output(True).set_dim([b, hq, sq, d]).set_stride([sq * ot, d, ot, 1]).set_data_type(dt)
            out.set_uid(UIDS["o"])
            if stats:
                lse.set_output(True).set_dim([b, hq, sq, 1]).set_stride([hq * sq, sq, 1, 1])
                lse.set_data_type(fp32).set_uid(UIDS["stats"])
            finish_graph(cudnn, g, limit)
            return g

        pointers = {"q": q, "k": k, "v": v, "o": o, **({"bias": key_bias} if key_bias else {})}
        pointers.update({"stats": stats} if stats else {})
        if padded:
            pointers.update(seq_q=seq_lens, seq_kv=seq_lens + 4 * b)
        self.bind(ctx, key, build, pointers)


class CudnnSdpaBackward:
    """One `sdpa_backward` node on cuDNN: the softmax statistics (log-sum-exp per query row, fp32) at
    `stats`, given by the forward (`sdpa_stats`) or, with `recompute_stats`, recomputed first by the forward
    SDPA with statistics (`CudnnSdpa(stats=...)`, its output written to dq's buffer, which the backward then
    overwrites); then cuDNN's flash-attention backward from q, k, v, the stored o and do, its graph shared
    per problem like the forward's. The backward is asked for cuDNN's deterministic algorithm first (so a
    training step repeats bit for bit); where that is refused, the default one."""

    kind = "cudnn"

    def __init__(
        self,
        ctx: CudnnContext,
        dtype: DType,
        b: int,
        sq: int,
        skv: int,
        hq: int,
        hkv: int,
        d: int,
        pointers: Mapping[str, int],
        stats: int,
        scale: float,
        token_strides: Mapping[str, int],
        deterministic: bool = True,
        recompute_stats: bool = True,
    ) -> None:
        t = token_strides  # elements between tokens of each of q k v o do dq dk dv
        rows = {"q": (sq, hq), "o": (sq, hq), "do": (sq, hq), "dq": (sq, hq),
                "k": (skv, hkv), "v": (skv, hkv), "dk": (skv, hkv), "dv": (skv, hkv)}  # fmt: skip

        def bhsd(g: Any, dt: Any, name: str) -> Any:
            s, h = rows[name]
            return g.tensor(name=name, dim=[b, h, s, d], stride=[s * t[name], d, t[name], 1], data_type=dt,
                            uid=UIDS[name])  # fmt: skip

        def build_backward(limit: int | None) -> Any:
            g, dt = half_graph(ctx, dtype)
            ins = {n: bhsd(g, dt, n) for n in ("q", "k", "v", "o", "do")}
            lse = g.tensor(name="stats", dim=[b, hq, sq, 1], stride=[hq * sq, sq, 1, 1],
                           data_type=ctx.lib.data_type.FLOAT, uid=UIDS["stats"])  # fmt: skip
            grads = g.sdpa_backward(
                name="sdpa_backward", q=ins["q"], k=ins["k"], v=ins["v"], o=ins["o"], dO=ins["do"], stats=lse,
                attn_scale=scale, use_causal_mask=False, use_deterministic_algorithm=self.deterministic,
            )  # fmt: skip
            for tensor, name in zip(grads, ("dq", "dk", "dv"), strict=True):
                s, h = rows[name]
                tensor.set_output(True).set_dim([b, h, s, d]).set_stride([s * t[name], d, t[name], 1])
                tensor.set_data_type(dt).set_uid(UIDS[name])
            finish_graph(ctx.lib, g, limit)
            return g

        self.ctx = ctx
        self.recompute: CudnnSdpa | None = None
        if recompute_stats:
            self.recompute = CudnnSdpa(
                ctx, dtype, b, sq, skv, hq, hkv, d, pointers["q"], pointers["k"], pointers["v"], pointers["dq"], scale,
                False, [t["q"], t["k"], t["v"], t["dq"]], stats=stats,
            )  # fmt: skip
        self.deterministic = deterministic
        common = (dtype, b, sq, skv, hq, hkv, d, scale, *(t[n] for n in rows))
        back_pointers = {**{n: pointers[n] for n in rows}, "stats": stats}
        try:
            self.backward, shared = ctx.shared_graph(
                ("sdpa-backward", self.deterministic, *common), build_backward, back_pointers
            )
        except Exception:  # noqa: BLE001 - no deterministic plan for this problem: cuDNN's default algorithm
            if not self.deterministic:
                raise
            self.deterministic = False
            self.backward, shared = ctx.shared_graph(("sdpa-backward", False, *common), build_backward, back_pointers)
        self.pack = SharedGraph.pack(back_pointers)
        how = "deterministic" if self.deterministic else "non-deterministic"
        stats_from = "statistics recomputed" if recompute_stats else "the forward's statistics"
        self.choice = f"{self.backward.choice}, {how}, {stats_from}{', graph shared' if shared else ''}"

    def __call__(self, stream: Any) -> None:
        if self.recompute is not None:
            self.recompute(stream)
        self.backward.graph.execute(self.pack, self.backward.workspace.ptr, handle=self.ctx.handle)


FP8_SCALES = ("descale_q", "descale_k", "descale_v", "scale_o", "descale_s", "scale_s", "amax_s", "amax_o")
"""The f32 scalars of an fp8 attention, in the order they lie in its scale buffer (`CudnnSdpaFp8`)."""


class CudnnSdpaFp8(GraphStep):
    """One `sdpa_fp8` node on cuDNN's fp8 flash attention: dense e4m3 q [B, Sq, Hq, D], k and v
    [B, Skv, Hkv, D] and output, each with one scale per tensor, read from (and the two amax outputs written
    to) a buffer of 8 f32 in `FP8_SCALES` order; with `seq_lens` (int32 [2, B]: query and key lengths) cuDNN's
    padding mask over the first seq_kv[b] keys, as `CudnnSdpa`'s. Hopper's fp8 attention writes an e4m3
    output, so the lowering dequantizes it after this step (lower/attention.py)."""

    def __init__(
        self, ctx: CudnnContext, b: int, sq: int, skv: int, hq: int, hkv: int, d: int, q: int, k: int, v: int,
        o: int, scales: int, scale: float, causal: bool, seq_lens: int = 0,
    ) -> None:  # fmt: skip
        padded = bool(seq_lens)
        key = ("sdpa_fp8", b, sq, skv, hq, hkv, d, scale, causal, padded)

        def build(limit: int | None) -> Any:
            cudnn = ctx.lib
            e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
            g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=ctx.handle)  # fmt: skip

            def bshd(name: str, s: int, h: int) -> Any:
                return g.tensor(name=name, dim=[b, h, s, d], stride=[s * h * d, d, h * d, 1], data_type=e4m3,
                                uid=UIDS[name])  # fmt: skip

            def scalar(name: str) -> Any:
                return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32, uid=UIDS[name])

            kwargs: dict[str, Any] = {n: scalar(n) for n in FP8_SCALES[:6]}
            if padded:
                kwargs.update(padding_mask(cudnn, g, b))
            out, _, amax_s, amax_o = g.sdpa_fp8(
                q=bshd("q", sq, hq), k=bshd("k", skv, hkv), v=bshd("v", skv, hkv), **kwargs, generate_stats=False,
                attn_scale=scale, use_causal_mask=causal, name="sdpa_fp8",
            )  # fmt: skip
            out.set_output(True).set_dim([b, hq, sq, d]).set_stride([sq * hq * d, d, hq * d, 1])
            out.set_data_type(e4m3).set_uid(UIDS["o"])
            for name, t in (("amax_s", amax_s), ("amax_o", amax_o)):
                t.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
                t.set_uid(UIDS[name])
            finish_graph(cudnn, g, limit)
            return g

        pointers = {"q": q, "k": k, "v": v, "o": o} | {n: scales + 4 * i for i, n in enumerate(FP8_SCALES)}
        if padded:
            pointers.update(seq_q=seq_lens, seq_kv=seq_lens + 4 * b)
        self.bind(ctx, key, build, pointers)


def half_graph(ctx: CudnnContext, dtype: DType) -> tuple[Any, Any]:
    """(a new cuDNN graph with fp16 / bf16 input and output and fp32 math, cuDNN's data type for `dtype`)."""
    cudnn = ctx.lib
    dt = cudnn.data_type.BFLOAT16 if dtype == DType.BF16 else cudnn.data_type.HALF
    fp32 = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=dt, intermediate_data_type=fp32, compute_data_type=fp32, handle=ctx.handle)
    return graph, dt


def finish_graph(cudnn: Any, graph: Any, workspace_limit: int | None) -> None:
    """Validate `graph`, lower it to cuDNN's operation graph and make its execution plans (none needing more
    workspace than `workspace_limit`, when given)."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if workspace_limit is not None:
        graph.deselect_workspace_greater_than(workspace_limit)
    graph.check_support()
