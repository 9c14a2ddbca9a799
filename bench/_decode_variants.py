"""The decode-step benchmark's variants: how each one (eager, Inductor, torchair path 4 and its
diagnostics) compiles and calls :class:`bench.model.DecoderStep`, and the two floor rows timed
with them (the weight GEMVs, and those plus Dynamo's per-call work, :class:`DynamoFloor`).

Split out of :mod:`bench.bench_decode_step` (whose docstring describes each variant) so the
variant definitions, the timing loop (:mod:`bench._decode_timing`) and the command line with its
printed report stay separate; :mod:`bench.bench_tp` builds its variants with
:func:`make_variant` too.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Callable

import torch

import torchair  # (registers torch.ops.npu.*)
from bench.model import DecoderStep, StepInput
from torchair.demo.roofline import GemvFloor
from torchair.ops.matmul import cpu as _mm

FLOOR = "floor-gemv"  # the pseudo-variant timed with the variants: the weight GEMVs alone
# the weight GEMVs, then Dynamo's per-call work on the same module with a backend that does
# nothing: what any torch.compile backend's step costs at least (see DynamoFloor)
DYNAMO_FLOOR = "floor-gemv+dynamo"
# --decompose: the step's attention calls alone, and the GEMVs then those calls (see AttentionCalls)
ATTN = "attn-alone"
GEMV_ATTN = "gemv+attn"
# variants called through Dynamo (torch.compile): the Dynamo floor is timed when one runs
THROUGH_DYNAMO = ("inductor", "torchair", "torchair-fx", "torchair-skipguards",
                  "torchair-guardfilter", "torchair-mm", "reduce-overhead")

ALL_VARIANTS = ("eager", "inductor", "torchair", "torchair-cache", "torchair-fx",
                "torchair-skipguards", "torchair-guardfilter", "torchair-mm", "torchair-ungrouped",
                "torchair-nodynamo", "reduce-overhead")
CUDA_ONLY, CPU_ONLY = ("reduce-overhead",), ("torchair-mm", "torchair-ungrouped")


@dataclasses.dataclass
class Variant:
    name: str
    describe: str
    compiled: Callable
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    before_call: Callable[[], None] | None = None
    result: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, step: StepInput) -> torch.Tensor:
        if self.before_call is not None:
            self.before_call()
        return self.compiled(step.x, step.pos, step.lens, self.k_caches, self.v_caches)


def _torchair_backend(run_eagerly: bool) -> Callable:
    cfg = torchair.CompilerConfig()
    cfg.experimental_config.tiling_schedule_optimize = True
    cfg.debug.run_eagerly = run_eagerly
    return torchair.get_npu_backend(compiler_config=cfg)


class _NoDynamo:
    """torchair path 4's compiled function called directly with Dynamo's flattened arguments:
    the step without Dynamo's per-call work (frame evaluation, guards, argument extraction).
    A diagnostic of where the step's time goes, not a way to call a model: nothing is guarded.

    The first call runs the Dynamo-compiled module (compiling it) and records the flat
    arguments the backend's function got; later calls rebuild them from the step's inputs: the
    step's ``x`` and ``pos`` where the first call had its own, the lengths at the int
    positions (checked against the first call's lengths, in order), everything else (weights,
    KV caches) as recorded."""

    def __init__(self, run_eagerly: bool = False) -> None:
        self.fn: Callable | None = None
        self.flat: tuple = ()
        self.run_eagerly = run_eagerly

    def backend(self, gm, example_inputs):
        fn = _torchair_backend(self.run_eagerly)(gm, example_inputs)

        def record(*flat):
            self.flat = flat
            return fn(*flat)

        self.fn = fn
        return record

    def bind(self, model: DecoderStep) -> Callable:
        compiled = torch.compile(model, backend=self.backend, dynamic=True, fullgraph=True)
        slots: dict[str, Any] = {}

        def call(x, pos, lens, k_caches, v_caches):
            if not slots:
                out = compiled(x, pos, lens, k_caches, v_caches)
                ints = [j for j, a in enumerate(self.flat) if isinstance(a, int)]
                if [self.flat[j] for j in ints] != list(lens):
                    raise RuntimeError(f"the flat arguments' ints {[self.flat[j] for j in ints]}"
                                       f" are not the lengths {list(lens)}")
                slots.update(x=[j for j, a in enumerate(self.flat) if a is x],
                             pos=[j for j, a in enumerate(self.flat) if a is pos], ints=ints)
                return out
            flat = list(self.flat)
            for j in slots["x"]:
                flat[j] = x
            for j in slots["pos"]:
                flat[j] = pos
            for j, n in zip(slots["ints"], lens):
                flat[j] = n
            return self.fn(*flat)[0]

        return call


class DynamoFloor:
    """Dynamo's own per-call work on the step: a copy of the module through
    ``torch.compile(dynamic=True, fullgraph=True)`` (KV caches ``mark_static``, as the
    variants) with a backend that runs the graph once and then hands back that first result.
    Called right after the weight GEMVs (``floor-gemv+dynamo`` row), so Dynamo's frame
    evaluation, guards and argument gathering run with the caches the step's weights evicted,
    as in a real step. This row minus ``floor-gemv`` is the work every ``torch.compile`` variant
    pays before its backend's code runs, measured in the same run."""

    def __init__(self, model: DecoderStep, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor], gemv: GemvFloor) -> None:
        import copy

        self.k_caches = [t.clone() for t in init_k]
        self.v_caches = [t.clone() for t in init_v]
        for t in self.k_caches + self.v_caches:
            torch._dynamo.mark_static(t)
        self.gemv = gemv
        self.graph_inputs = 0
        self.compiled = torch.compile(copy.deepcopy(model), backend=self._backend, dynamic=True,
                                      fullgraph=True)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graph_inputs = len(example_inputs)
        saved: list = []

        def first_result(*flat: Any) -> Any:
            if not saved:
                saved.append(gm.forward(*flat))
            return saved[0]

        return first_result

    def __call__(self, step: StepInput) -> None:
        self.gemv()
        self.compiled(step.x, step.pos, step.lens, self.k_caches, self.v_caches)


class AttentionCalls:
    """The step's attention calls alone, one per layer, as a CPU static unit makes them
    (``torch.ops.torchair_native.ifa_decode``, the C++ launch kernel, with the lengths as an
    int64 tensor; ``npu_incre_flash_attention`` where the launch library is not built), on
    copies of the initial KV caches (read only) with a fixed random query per layer. Timed
    interleaved with the variants (``--decompose``), alone (``attn-alone``) and right after the
    weight GEMVs (``gemv+attn``): the first against the floor's KV term shows the attention's
    own excess, the second against the two alone what running both in one step costs (each
    evicts the other's data from the caches)."""

    def __init__(self, cfg: Any, init_k: list[torch.Tensor], init_v: list[torch.Tensor],
                 schedule: list[StepInput]) -> None:
        from torchair.ops.attention.cpu import launch_fakes, launch_library

        self.k_caches = [t.clone() for t in init_k]
        self.v_caches = [t.clone() for t in init_v]
        batch, dtype, device = init_k[0].shape[0], init_k[0].dtype, init_k[0].device
        gen = torch.Generator().manual_seed(0)
        self.queries = [torch.randn(batch, 1, cfg.hidden, generator=gen).to(device, dtype)
                        for _ in init_k]
        self.heads, self.kv_heads, self.scale = cfg.heads, cfg.kv_heads, cfg.head_dim ** -0.5
        self.launch = None
        if device.type == "cpu" and launch_library.available():
            self.launch = launch_fakes.ifa_decode()
            self.layout = launch_library.LAYOUTS["BSH"]
            # the lengths tensors made before the timing, as a unit receives them
            self.lengths = {id(s): torch.tensor(s.lens, dtype=torch.int64) for s in schedule}
        self.describe = ("torchair_native::ifa_decode (C++ launch kernel)" if self.launch
                         else "npu_incre_flash_attention")

    def __call__(self, step: StepInput) -> list[torch.Tensor]:
        """Every layer's attention output for ``step`` (a step of the schedule given)."""
        if self.launch is not None:
            lengths = self.lengths[id(step)]
            return [self.launch(q, k, v, lengths, None, None, self.heads, self.kv_heads,
                                self.layout, 0, self.scale)
                    for q, k, v in zip(self.queries, self.k_caches, self.v_caches)]
        return [torch.ops.npu.npu_incre_flash_attention(
                    q, k, v, actual_seq_lengths=step.lens, num_heads=self.heads,
                    num_key_value_heads=self.kv_heads, input_layout="BSH",
                    scale_value=self.scale)
                for q, k, v in zip(self.queries, self.k_caches, self.v_caches)]


def make_variant(name: str, model: DecoderStep, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor], *, run_eagerly: bool = False) -> Variant:
    """Variant ``name`` of ``model`` with its own copies of the KV caches; ``run_eagerly``: the
    ``torchair-cache``, ``torchair-ungrouped`` and ``torchair-nodynamo`` units with the FX
    engine (quick test runs)."""
    k_caches = [t.clone() for t in init_k]
    v_caches = [t.clone() for t in init_v]
    for t in k_caches + v_caches:
        torch._dynamo.mark_static(t)
    before_call = None
    if name == "eager":
        compiled, describe = model, "the module called directly (no_grad)"
    elif name == "inductor":
        compiled = torch.compile(model, backend="inductor", dynamic=True, fullgraph=True)
        describe = ("torch.compile(backend='inductor', dynamic=True, fullgraph=True), tensors "
                    "mark_static, lengths SymInts (one compile for all lengths)")
    elif name == "torchair":
        compiled = torch.compile(model, backend=_torchair_backend(False), dynamic=True,
                                 fullgraph=True)
        describe = ("torchair path 4: dynamic=True + mark_static + tiling_schedule_optimize, "
                    "default engine (Inductor)")
    elif name in ("torchair-cache", "torchair-ungrouped"):
        config = torchair.CompilerConfig()
        config.experimental_config.tiling_schedule_optimize = True
        config.debug.run_eagerly = run_eagerly
        cache_dir = tempfile.mkdtemp(prefix="bench-decode-cache-")
        atexit.register(shutil.rmtree, cache_dir, True)
        compiled = torchair.inference.cache_compile(model.forward, config=config,
                                                    cache_dir=cache_dir)
        describe = (f"torchair path 4 through cache_compile (later calls from the entry, "
                    f"TORCHAIR_CACHE_GUARDS={os.environ.get('TORCHAIR_CACHE_GUARDS', 'arguments')})")
        if name == "torchair-ungrouped":
            compiled = built_with(compiled, {_mm.GROUP_SWITCH: "0"})
            describe = (f"torchair-cache built with {_mm.GROUP_SWITCH}=0: one gemv call per "
                        f"product, no gemv_cat for the products of one input (q/k/v, gate/up)")
    elif name == "torchair-fx":
        compiled = torch.compile(model, backend=_torchair_backend(True), dynamic=True,
                                 fullgraph=True)
        describe = "torchair path 4 with debug.run_eagerly=True (FX engine)"
    elif name == "torchair-skipguards":
        inner = torch.compile(model, backend=_torchair_backend(False), dynamic=True,
                              fullgraph=True)

        stance: list = []

        def compiled(*args):
            if not stance:  # the stance refuses to compile: the first call compiles outside it
                # building a set_stance object costs ~90 us (it sets the stance; __exit__ puts
                # the previous one back): built once, then entered around each call (~3 us)
                stance.append(torch.compiler.set_stance("default", skip_guard_eval_unsafe=True))
                stance[0].__exit__(None, None, None)
                return inner(*args)
            with stance[0]:
                return inner(*args)

        describe = ("torchair path 4 under torch.compiler.set_stance(skip_guard_eval_unsafe="
                    "True): only the guards that tell cache entries apart (a user's opt-in, "
                    "unsafe if guarded state changes)")
    elif name == "torchair-guardfilter":
        compiled = torch.compile(model, backend=_torchair_backend(False), dynamic=True,
                                 fullgraph=True, options={
                                     "guard_filter_fn":
                                     torch.compiler.skip_guard_on_all_nn_modules_unsafe})
        describe = ("torchair path 4 with guard_filter_fn=skip_guard_on_all_nn_modules_unsafe: "
                    "no guards on module state (a user's opt-in, unsafe if a module's "
                    "attributes or parameters change)")
    elif name == "torchair-mm":
        compiled = built_with(torch.compile(model, backend=_torchair_backend(False),
                                             dynamic=True, fullgraph=True),
                               {_mm.ENV_SWITCH: "0"})
        describe = (f"torchair path 4 built with {_mm.ENV_SWITCH}=0: its products are ATen's mm, "
                    f"not torchair_native::gemv")
    elif name == "torchair-nodynamo":
        compiled = _NoDynamo(run_eagerly).bind(model)
        describe = ("torchair path 4's compiled function called directly with Dynamo's flat "
                    "arguments: the step minus Dynamo's per-call work (diagnostic: unguarded)")
    elif name == "reduce-overhead":
        for t in k_caches + v_caches:
            torch._dynamo.mark_static_address(t)
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=True, fullgraph=True)
        before_call = torch.compiler.cudagraph_mark_step_begin
        describe = ("torch.compile(mode='reduce-overhead', dynamic=True, fullgraph=True), "
                    "tensors mark_static, KV caches mark_static_address")
    else:
        raise ValueError(name)
    return Variant(name, describe, compiled, k_caches, v_caches, before_call)


def built_with(compiled: Callable, env: dict[str, str]) -> Callable:
    """``compiled`` whose first (compiling) call runs with ``env`` set in ``os.environ``; the
    variables are put back after it."""
    built: list[bool] = []

    def call(*args):
        if built:
            return compiled(*args)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return compiled(*args)
        finally:
            built.append(True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return call


def reset_caches(variant: Variant, init_k: list[torch.Tensor],
                 init_v: list[torch.Tensor]) -> None:
    """Back to the initial cache content, in place (static units keep the same buffers)."""
    with torch.no_grad():
        for dst, src in zip(variant.k_caches + variant.v_caches, init_k + init_v):
            dst.copy_(src)
