"""``register_replacement``: user and default FX fusion patterns, one pattern table.

A pattern is a pair of plain functions: ``search_fn`` (the subgraph to find) and ``replace_fn``
(what replaces it), both traced to ATen with :func:`trace_forward` on ``example_inputs``. The
matching engine is PyTorch's own (``torch._inductor.pattern_matcher``, as in TorchAir): the
first match ignores Python ints, floats, dtypes and lists (shapes get burned into a trace), then
every candidate is checked three times before anything is rewritten:

1. PyTorch re-traces ``search_fn`` with the candidate's real shapes and re-matches it exactly
   (a different permute order, view shape or dtype fails here);
2. the user's ``extra_check(match)``;
3. torchair runs ``search_fn`` and ``replace_fn`` on the candidate's fake values and requires the
   same output structure, shapes and dtypes (a replacement that would change a graph output's
   meaning is refused instead of silently rewritten).

A rejected candidate is logged at DEBUG with the reason. All patterns (the defaults of
:mod:`torchair.patterns.add_rms_norm` and the user's) run in one pass,
:class:`torchair.passes.pattern_fusion.PatternFusionPass`, switched by
``experimental_config.pattern_fusion_pass``.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from torchair.base.log import logger

MIN_TORCH = (2, 6)
REGISTRY_LOCK = threading.RLock()
_table = None  # the PatternMatcherPass holding every registered pattern (created lazily)
_names: list[str] = []
_sources: list[tuple[str, str]] = []  # (name, source of search_fn + replace_fn), for cache keys
_counts: dict[str, int] | None = None  # per-pattern rewrites of the pass now running
# The first match's kwargs while PyTorch re-checks it (see _validated): torch 2.11 drops them.
_first_match_kwargs: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "torchair_first_match_kwargs", default=None)


def torch_supported() -> bool:
    """Pattern fusion relies on the pattern matcher of torch >= 2.6 (as TorchAir does)."""
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return version >= MIN_TORCH


@functools.lru_cache(maxsize=1)
def _warn_unsupported() -> None:
    logger.warning("pattern fusion needs torch >= %d.%d (this is %s): register_replacement and "
                   "the default fusion passes are skipped", *MIN_TORCH, torch.__version__)


def trace_forward(fn: Callable, args: Sequence[Any], **_ignored: Any) -> fx.GraphModule:
    """Trace ``fn(*args)`` to an ATen inference graph shaped like the backend's graphs.

    No decompositions (the backend's AOT graph keeps ops such as ``_to_copy`` and the ``npu``
    ops whole), then identity ops and dead code removed. Extra keyword arguments from PyTorch's
    matcher (``get_decomp_fn``) are ignored on purpose.
    """
    from torch._inductor.fx_passes.post_grad import remove_noop_ops
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    with torch.no_grad(), torch._C._EnablePythonDispatcher(), preserve_node_meta():
        gm = make_fx(fn, {}, tracing_mode="real")(*args)
    remove_noop_ops(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _pattern_table():
    global _table
    if _table is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        _table = PatternMatcherPass(pass_name="torchair_pattern_fusion")
    return _table


def _always(match) -> bool:
    return True


def register_replacement(search_fn: Callable, replace_fn: Callable,
                         example_inputs: Sequence[Any], trace_fn: Callable | None = None,
                         extra_check: Callable[[Any], bool] = _always,
                         search_fn_pattern: Any = None,
                         scalar_workaround: dict[str, float | int] | None = None,
                         skip_duplicates: bool = False, *, name: str | None = None) -> bool:
    """Register a user fusion pattern: wherever ``search_fn``'s graph occurs, use ``replace_fn``.

    Parameters
    ----------
    search_fn, replace_fn
        Functions of the same positional arguments (tensors; scalars named in
        ``scalar_workaround``); ``search_fn`` is traced to the subgraph to find, ``replace_fn``
        to what replaces it. Both must return the same structure of tensors with equal shapes
        and dtypes; a match where they do not is refused.
    example_inputs
        One example per argument, used to trace the pattern (any shapes: the match is
        re-checked with the graph's real shapes).
    trace_fn
        How to trace; default :func:`trace_forward` (the backend's graph form).
    extra_check
        ``extra_check(match) -> bool``: further conditions on a candidate (its ``kwargs`` map
        argument names to graph nodes).
    search_fn_pattern
        A ready ``PatternExpr`` to match instead of tracing ``search_fn``.
    scalar_workaround
        ``{arg_name: example_value}`` for scalar arguments (e.g. an epsilon), matched as values.
    skip_duplicates
        Silently skip a pattern equal to one already registered (otherwise PyTorch refuses it).
    name
        Name in graph reports (default: ``search_fn``'s name).

    Returns True when registered; False when skipped (duplicate, or torch older than 2.6, which
    warns once). The patterns run in the pattern fusion pass of every graph compiled afterwards
    with ``experimental_config.pattern_fusion_pass = True`` (the default).
    """
    if not torch_supported():
        _warn_unsupported()
        return False
    for arg, fn in (("search_fn", search_fn), ("replace_fn", replace_fn)):
        if not callable(fn):
            raise TypeError(f"register_replacement: {arg} must be a function, got "
                            f"{type(fn).__name__}")
    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(f"register_replacement: example_inputs must be a list or tuple with one "
                        f"value per argument of search_fn, got {type(example_inputs).__name__}")
    nargs = len(inspect.signature(search_fn).parameters)
    if len(example_inputs) != nargs:
        raise ValueError(f"register_replacement: search_fn takes {nargs} arguments but "
                         f"example_inputs has {len(example_inputs)} values; give one per argument")
    name = name or getattr(search_fn, "__name__", None) or repr(search_fn)
    checked = functools.partial(_validated, search_fn, replace_fn, extra_check)
    replay = functools.partial(_replay_check, search_fn, replace_fn, trace_fn or trace_forward,
                               checked)
    same = functools.partial(_replay_equal, search_fn)
    with REGISTRY_LOCK:
        table = _pattern_table()
        before = {key: list(entries) for key, entries in table.patterns.items()}
        added = _inductor_register(search_fn, replace_fn, example_inputs,
                                   trace_fn or trace_forward, table, checked,
                                   scalar_workaround, search_fn_pattern, skip_duplicates)
        for key, entries in table.patterns.items():
            for entry in entries:
                if not any(entry is old for old in before.get(key, ())):
                    entry.extra_check = _logged(name, entry.extra_check, replay, same)
        if added and name not in _names:
            _names.append(name)
        if added and not getattr(search_fn, "__module__", "").startswith("torchair."):
            # torchair's own patterns are covered by its source hash; user patterns by this
            _sources.append((name, _fn_source(search_fn) + _fn_source(replace_fn)))
    logger.debug("pattern %s registered: %s", name, "yes" if added else "skipped (duplicate)")
    return bool(added)


def _inductor_register(search_fn, replace_fn, example_inputs, trace_fn, table, extra_check,
                       scalar_workaround, search_fn_pattern, skip_duplicates) -> bool:
    from torch._inductor import pattern_matcher

    kwargs = dict(extra_check=extra_check, scalar_workaround=scalar_workaround,
                  search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates)
    accepted = inspect.signature(pattern_matcher.register_replacement).parameters
    if "get_decomp_fn" in accepted:
        kwargs["get_decomp_fn"] = dict  # no decompositions, as the backend's graphs
    if not skip_duplicates:
        kwargs.pop("skip_duplicates")  # older signatures may not know it
    return pattern_matcher.register_replacement(search_fn, replace_fn, list(example_inputs),
                                                trace_fn, table, **kwargs)


class _Rejected(Exception):
    pass


def _logged(name: str, check: Callable, replay: Callable, same: Callable) -> Callable:
    """Wrap a pattern entry's check: count accepted rewrites, log rejections at DEBUG.

    After PyTorch's exact re-match (which ignores keyword arguments a matched node has beyond the
    pattern's, e.g. ``add(x, y, alpha=2)``) every candidate is also replayed
    (:func:`_replay_equal`). PyTorch's re-match cannot follow sizes that are graph inputs of their
    own (``dynamic=True`` graphs pass symbolic sizes as SymInt placeholders); for a candidate with
    symbolic shapes that it refused, :func:`_replay_check` decides instead. Any error while
    checking rejects the candidate: a check never fails the compile.
    """

    def run(match) -> bool:
        node = match.output_nodes()[0] if match.nodes else None
        reason = "the graph differs from the pattern at its real shapes/arguments"
        token = _first_match_kwargs.set(dict(match.kwargs))
        try:
            ok = bool(check(match))
            if ok:
                _within_one_scope(match)
                same(match)
            elif _symbolic(match):
                ok = replay(match)
        except _Rejected as rejected:
            ok, reason = False, str(rejected)
        except Exception as error:  # noqa: BLE001 - e.g. a fake kernel refusing the re-trace
            ok, reason = False, f"checking it raised {type(error).__name__}: {error}"
        finally:
            _first_match_kwargs.reset(token)
        if ok:
            if _counts is not None:
                _counts[name] = _counts.get(name, 0) + 1
        else:
            logger.debug("pattern %s: candidate ending at node %s rejected: %s", name,
                         getattr(node, "name", node), reason)
        return ok

    return run


_MARKERS = ("_super_kernel_begin", "_super_kernel_end", "_stream_switch_begin",
            "_stream_switch_end")


def _within_one_scope(match) -> None:
    """Refuse a candidate with a ``super_kernel`` scope or ``npu_stream_switch`` marker between
    its nodes: the fused op would belong to no single scope or stream."""
    markers = {getattr(getattr(torch.ops.npu, m, None), "default", None) for m in _MARKERS}
    markers.discard(None)
    if not markers:
        return
    order = {n: i for i, n in enumerate(match.graph.nodes)}
    first = min(order[n] for n in match.nodes)
    last = max(order[n] for n in match.nodes)
    for node in match.graph.nodes:
        if first < order[node] < last and node.op == "call_function" and node.target in markers:
            kind = "stream switch" if "stream" in str(node.target) else "super_kernel scope"
            raise _Rejected(f"it crosses the {kind} marker `{node.name}`")


def _validated(search_fn: Callable, replace_fn: Callable, extra_check: Callable, match) -> bool:
    # ``match`` is PyTorch's re-match at the real shapes. Torch 2.11 re-traces search_fn with the
    # graph's own scalar (e.g. eps=1e-05), not the ``scalar_workaround`` example, so the scalar is
    # a literal of the re-traced pattern and its name is missing from this match's kwargs (torch
    # 2.13 fills such names in from the first match). Fill them in the same way, from the first
    # match: the re-match has already checked the graph holds that very value.
    for key, value in (_first_match_kwargs.get() or {}).items():
        match.kwargs.setdefault(key, value)
    if not extra_check(match):
        raise _Rejected("extra_check returned False")
    args = [_value(match.kwargs[p]) for p in inspect.signature(search_fn).parameters]
    fake_mode = torch._guards.detect_fake_mode(args)
    if fake_mode is None:
        raise _Rejected("the matched nodes carry no fake values (node.meta['val'])")
    with fake_mode, torch.no_grad():
        try:
            found = search_fn(*args)
            replaced = replace_fn(*args)
        except Exception as error:  # noqa: BLE001 - any failure means: do not rewrite
            raise _Rejected(f"search_fn/replace_fn failed on the matched values: "
                            f"{error}") from error
    problem = _differs(found, replaced)
    if problem:
        raise _Rejected(f"replace_fn's result differs from search_fn's: {problem}")
    return True


def _value(arg: Any) -> Any:
    return pytree.tree_map(lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a, arg)


def _differs(found: Any, replaced: Any) -> str:
    found_leaves, found_spec = pytree.tree_flatten(found)
    replaced_leaves, replaced_spec = pytree.tree_flatten(replaced)
    if found_spec != replaced_spec:
        return f"structure {found_spec} vs {replaced_spec}"
    for i, (a, b) in enumerate(zip(found_leaves, replaced_leaves)):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"output {i}: tensor vs non-tensor"
        if not isinstance(a, torch.Tensor):
            continue
        if a.dtype != b.dtype:
            return f"output {i}: dtype {a.dtype} vs {b.dtype}"
        if a.dim() != b.dim() or not all(
                torch.fx.experimental.symbolic_shapes.statically_known_true(x == y)
                for x, y in zip(a.shape, b.shape)):
            return f"output {i}: shape {list(a.shape)} vs {list(b.shape)}"
    return ""


def _symbolic(match) -> bool:
    values = [_value(v) for v in match.kwargs.values()]
    return any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())))
        for x in pytree.tree_leaves(values))


def _hint(v: Any) -> Any:
    if not isinstance(v, torch.SymInt):
        return v
    hint = v.node.hint
    return int(hint if hint is not None else v.node.shape_env.size_hint(v.node.expr))


def _random_like(value: Any, generator: torch.Generator) -> Any:
    """A real tensor with ``value``'s dtype and its shape at the shape hints (random data)."""
    if not isinstance(value, torch.Tensor):
        return _hint(value)
    shape = [_hint(d) for d in value.shape]
    if value.dtype.is_floating_point or value.dtype.is_complex:
        data = torch.randn(shape, generator=generator)
    elif value.dtype == torch.bool:
        data = torch.rand(shape, generator=generator) > 0.5
    else:
        data = torch.randint(-8, 8, shape, generator=generator)
    return data.to(device=value.device, dtype=value.dtype)


def _replay_equal(search_fn: Callable, match) -> None:
    """Replay a candidate: the matched nodes and ``search_fn`` run on the same random inputs (at
    the shapes' hints, on the values' devices) must give bit-identical results, else
    :class:`_Rejected`.

    The structural match fixed the op structure; replaying checks by their effect what it does
    not compare: ints, lists and dtypes it ignored (a permute order, a view shape), keyword
    arguments beyond the pattern's (``alpha=2``).
    """
    argnames = list(inspect.signature(search_fn).parameters)
    if any(name not in match.kwargs for name in argnames):
        raise _Rejected("the candidate does not bind every argument of search_fn")
    generator = torch.Generator().manual_seed(0)
    # real tensors: outside any fake / proxy mode the compiler may run under
    with torch.no_grad(), torch.utils._python_dispatch._disable_current_modes():
        by_node: dict = {}  # one random value per distinct node (x1 and x2 may be one node)
        real = []
        for name in argnames:
            arg = match.kwargs[name]
            if isinstance(arg, fx.Node):
                if arg not in by_node:
                    by_node[arg] = _random_like(_value(arg), generator)
                real.append(by_node[arg])
            else:
                real.append(_random_like(_value(arg), generator))
        try:
            expected = pytree.tree_leaves(search_fn(*real))
            found = _run_matched(match, by_node)
        except Exception as error:  # noqa: BLE001 - a candidate that cannot be replayed is refused
            raise _Rejected(f"replaying the candidate failed: {error}") from error
        same = len(expected) == len(found) and all(
            isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(expected, found))
    if not same:
        raise _Rejected("replayed on random inputs, the graph computes something else than "
                        "search_fn (another permutation, view shape, dtype or argument)")


def _replay_check(search_fn: Callable, replace_fn: Callable, trace_fn: Callable,
                  validated: Callable, match) -> bool:
    """Accept a symbolic-shape candidate PyTorch's re-match refused, if replaying agrees."""
    _replay_equal(search_fn, match)
    validated(match)
    values = [_value(match.kwargs[name]) for name in inspect.signature(search_fn).parameters]
    fake_mode = torch._guards.detect_fake_mode(values)
    with fake_mode:
        args = [torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=v.device)
                if isinstance(v, torch.Tensor) else v for v in values]
        match.replacement_graph = trace_fn(replace_fn, args)
    return True


def _run_matched(match, inputs: dict) -> list:
    """Evaluate the matched nodes on ``inputs`` (node -> real value); returns the match's outputs.

    Values from outside the match that are not pattern arguments must be sizes (SymInts): they
    are taken at their hints, as the random inputs are.
    """
    env = dict(inputs)
    order = {n: i for i, n in enumerate(match.graph.nodes)}

    def load(a):
        if not isinstance(a, fx.Node):
            return a
        if a not in env:
            value = a.meta.get("val")
            if not isinstance(value, (int, torch.SymInt)):
                raise _Rejected(f"node {a.name} feeds the candidate but is not an argument")
            env[a] = _hint(value)
        return env[a]

    for node in sorted(match.nodes, key=order.__getitem__):
        if node in env:
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), load)
        env[node] = node.target(*args, **kwargs)
    return [env[n] for n in match.output_nodes()]


def _fn_source(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return repr(getattr(fn, "__code__", fn))


def registered_sources() -> tuple[tuple[str, str], ...]:
    """(name, source) of every registered pattern: what a compile cache key must cover."""
    return tuple(_sources)


def registered_patterns() -> tuple[str, ...]:
    """Names of the registered patterns, in registration order."""
    return tuple(_names)


def apply_patterns(gm: fx.GraphModule) -> dict[str, int]:
    """Run every registered pattern on ``gm`` once; returns rewrites per pattern name."""
    global _counts
    with REGISTRY_LOCK:
        table = _pattern_table()
        if not table.patterns:
            return {}
        _counts = {}
        try:
            table.apply(gm)
            counts = _counts
        finally:
            _counts = None
    return counts


@contextlib.contextmanager
def isolated_patterns():
    """Patterns registered inside the ``with`` block are forgotten at its end (for tests)."""
    with REGISTRY_LOCK:
        table = _pattern_table()
        saved = ({k: list(v) for k, v in table.patterns.items()},
                 {k: list(v) for k, v in getattr(table, "seen_patterns", {}).items()},
                 list(_names), list(_sources))
    try:
        yield
    finally:
        with REGISTRY_LOCK:
            table.patterns.clear()
            table.patterns.update(saved[0])
            if hasattr(table, "seen_patterns"):
                table.seen_patterns.clear()
                table.seen_patterns.update(saved[1])
            _names[:] = saved[2]
            _sources[:] = saved[3]
