"""Trace the model into an ``ExportedProgram`` the way TorchAir's ``dynamo_export`` traces it.

TorchAir compiles the model with ``torch.compile(fullgraph=True, dynamic=dynamic)`` (Dynamo) and
exports the graph Dynamo hands its backend. Here ``torch.export.export(strict=True)`` runs the
same Dynamo tracer and keeps the result as an exported program (its inputs, outputs and shape
ranges), which AOTInductor compiles into a package:

- ``dynamic=False``: every input shape is fixed, as in a ``dynamic=False`` compile.
- ``dynamic=True``: every dim of every tensor argument gets ``Dim.AUTO``: the dims Dynamo keeps
  dynamic under ``dynamic=True`` stay dynamic (``-1`` in ``dynamo.pbtxt``), the ones the model
  fixes (a Linear's features, size 0/1 dims) are specialized, without an error.
- Non-tensor arguments (ints, floats, strings) are constants of the package, as Dynamo
  specializes them; the loader checks they are passed unchanged.
- Collectives: ``dist.all_reduce`` & co. are traced as functional collectives
  (``_c10d_functional.*``, TorchAir traces them as HCCL ops); ``patch_for_hcom``'s table is in
  effect while tracing, so ``dist.broadcast`` / ``dist.all_to_all`` trace too and a collective
  without a process group fails with an error that names it.
"""
from __future__ import annotations

import inspect
import traceback
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchair.base.registry import NAMESPACE, defined_here
from torchair.distributed import hcom

__all__ = ["check_ops", "collectives_in", "dynamic_shapes_for", "trace"]

# Namespaces AOTInductor lowers itself or calls through its C shims.
_BUILTIN_NAMESPACES = ("aten", "prims", "_c10d_functional", "_c10d_functional_autograd", "c10d",
                       "_quantized", "quantized", "higher_order")
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d")


def dynamic_shapes_for(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``torch.export`` dynamic shapes marking every dim of every tensor argument ``Dim.AUTO``."""
    from torch.export import Dim

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {d: Dim.AUTO for d in range(value.dim())} or None
        return None

    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return {name: pytree.tree_map(spec, value) for name, value in bound.arguments.items()}


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _collective_named(chain: list[BaseException]) -> str | None:
    """The torch.distributed function a failed trace was in, if any."""
    for exc in chain:
        text = str(exc)
        if "needs a process group" in text and "torch.distributed." in text:
            return text.split("torch.distributed.", 1)[1].split()[0]
        names = [frame.name for frame in traceback.extract_tb(exc.__traceback__)
                 if "torch/distributed/" in frame.filename.replace("\\", "/")
                 and not frame.name.startswith("_")]
        if names:
            return names[0]
        if "group cannot be None" in text:
            return "a collective"
    return None


def trace(model: torch.nn.Module, args: tuple, kwargs: dict, *, dynamic: bool):
    """Dynamo-trace ``model(*args, **kwargs)`` into an ``ExportedProgram`` (no grad)."""
    dynamic_shapes = dynamic_shapes_for(model, args, kwargs) if dynamic else None
    patched_here = not hcom.patched_for_hcom()
    if patched_here:
        hcom.patch_for_hcom()
    try:
        with torch.no_grad():
            return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                       strict=True)
    except Exception as exc:
        chain = _chain(exc)
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            op = _collective_named(chain)
            if op is not None:
                raise RuntimeError(
                    f"dynamo_export: the model calls torch.distributed {op}, but no process group "
                    f"exists in this process; call torch.distributed.init_process_group(...) "
                    f"(gloo on CPU, nccl on CUDA) on every rank before dynamo_export: each rank "
                    f"then writes its own package (export_path/<export_name><rank>.pt2)") from exc
        raise RuntimeError(
            f"dynamo_export: Dynamo could not trace {type(model).__name__} into one graph "
            f"(TorchAir exports with fullgraph=True): {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. Make forward() one "
            f"graph (no data-dependent Python control flow, no graph breaks) and export again"
        ) from exc
    finally:
        if patched_here:
            hcom.unpatch_for_hcom()


def _graph_modules(gm: torch.fx.GraphModule):
    yield gm
    for child in gm.children():
        if isinstance(child, torch.fx.GraphModule):
            yield from _graph_modules(child)


def _ops(ep) -> list[torch._ops.OpOverload]:
    seen: dict[str, torch._ops.OpOverload] = {}
    for gm in _graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                seen.setdefault(str(node.target), node.target)
    return list(seen.values())


def collectives_in(ep) -> list[str]:
    """The collective ops of the exported graph, e.g. ``['_c10d_functional.all_reduce']``."""
    return sorted({f"{op.namespace}.{op._schema.name.split('::')[-1]}" for op in _ops(ep)
                   if op.namespace in _COLLECTIVE_NAMESPACES and "wait_tensor" not in op.name()})


def _python_only(op: torch._ops.OpOverload) -> bool:
    """Whether ``op``'s kernels were registered from Python (torch.library) in this process."""
    qualname = op._schema.name  # "ns::name"
    try:
        from torch._library.custom_ops import OPDEFS
        if qualname in OPDEFS:
            return True
    except ImportError:  # pragma: no cover - older torch
        pass
    ns, name = qualname.split("::", 1)
    prefix = f"{ns}/{name}/"
    return any(key.startswith(prefix) for key in getattr(torch.library, "_impls", ()))


def check_ops(ep) -> list[str]:
    """Raise for ops a deployment cannot run without the model's Python code; return the npu
    ops of torchair's library the package calls (the loading process imports torchair)."""
    npu_ops = []
    for op in _ops(ep):
        ns = op.namespace
        if ns in _BUILTIN_NAMESPACES:
            continue
        name = op._schema.name.split("::", 1)[-1]
        if ns == NAMESPACE and defined_here(name):
            npu_ops.append(f"npu.{name}")
            continue
        if _python_only(op):
            raise RuntimeError(
                f"dynamo_export: op {ns}::{name} has only Python kernels (registered with "
                f"torch.library from Python); the package would call it through the dispatcher of "
                f"the loading process, which does not have the model's Python code. Register it in "
                f"C++ (TORCH_LIBRARY + a kernel in a shared library the deployment loads), or "
                f"write it with aten ops, then export again")
    return sorted(npu_ops)
