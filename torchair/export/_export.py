"""``dynamo_export``: trace, check, describe and AOT-compile one model into a package."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

import torch

from torchair.base.log import logger, progress
from torchair.configs.compiler_config import CompilerConfig
from torchair.export import _describe
from torchair.export._layout import ExportLayout, layout_for
from torchair.export._trace import check_ops, collectives_in, trace

__all__ = ["EXTERNAL_WEIGHTS_BYTES", "dynamo_export", "rank_inductor_dir"]

# TorchAir keeps weights inside the .air up to protobuf's 2 GB limit less 200 MB of headroom and
# writes them beside it above that (export_utils._is_weight_externalized). The same threshold
# decides here whether weights go into the package's shared library or beside it in the package.
EXTERNAL_WEIGHTS_BYTES = (2048 - 200) * 1024 * 1024
WEIGHTS_IN_SO, WEIGHTS_BLOB = "in_so", "binary_blob"


def _weight_bytes(ep) -> int:
    tensors = list(ep.state_dict.values()) + list(getattr(ep, "constants", {}).values())
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _weights_options(ep) -> tuple[str, dict[str, Any]]:
    """Where the weights go, as AOTInductor options (see EXTERNAL_WEIGHTS_BYTES)."""
    size = _weight_bytes(ep)
    if size <= EXTERNAL_WEIGHTS_BYTES:
        logger.info("dynamo_export: %.1f MB of weights, inside the package's shared library",
                    size / 2**20)
        return WEIGHTS_IN_SO, {}
    from torch._inductor import config as inductor_config

    if not hasattr(inductor_config.aot_inductor, "package_constants_on_disk_format"):
        logger.warning("dynamo_export: %.1f MB of weights exceed %.0f MB, but this PyTorch's "
                       "AOTInductor cannot store them outside its shared library; they stay "
                       "inside it", size / 2**20, EXTERNAL_WEIGHTS_BYTES / 2**20)
        return WEIGHTS_IN_SO, {}
    logger.info("dynamo_export: %.1f MB of weights exceed %.0f MB: stored as one blob beside the "
                "shared library, inside the package", size / 2**20, EXTERNAL_WEIGHTS_BYTES / 2**20)
    return WEIGHTS_BLOB, {"aot_inductor.package_constants_in_so": False,
                          "aot_inductor.package_constants_on_disk_format": WEIGHTS_BLOB}


def rank_inductor_dir(rank: int) -> str:
    """The Inductor cache directory rank ``rank``'s exports compile in: ``torchair_export/rank<r>``
    under Inductor's own (``$TORCHINDUCTOR_CACHE_DIR``, else PyTorch's default).

    AOTInductor writes a package's files (shared library, weights blob, metadata JSON) under a
    directory named after the hash of the graph's code, and packages them after releasing its
    lock on that directory. Tensor-parallel ranks export graphs of one structure: the same
    code, the same directory, different weights and metadata, at the same moment. So one rank
    could package another's weights, or a JSON file the other is rewriting (a load then fails
    with "parse error ... empty input"). Each rank compiling in its own directory cannot."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "torchair_export", f"rank{rank}")


@contextlib.contextmanager
def _inductor_dir(rank: int | None) -> Iterator[None]:
    """Inductor's cache directory is :func:`rank_inductor_dir` while a rank's export compiles
    (``$TORCHINDUCTOR_CACHE_DIR``, which Inductor reads at each use; put back after). A process
    without a process group compiles where Inductor always does."""
    if rank is None:
        yield
        return
    key = "TORCHINDUCTOR_CACHE_DIR"
    before = os.environ.get(key)
    private = rank_inductor_dir(rank)
    os.makedirs(private, exist_ok=True)
    os.environ[key] = private
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _check_args(model: Any, config: Any, dynamic: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"dynamo_export: model must be a torch.nn.Module (pass it as "
                        f"model=...; the positional arguments are its inputs), got "
                        f"{type(model).__name__}")
    if not isinstance(config, CompilerConfig):
        raise TypeError(f"dynamo_export: config must be a torchair.CompilerConfig, got "
                        f"{type(config).__name__}")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamo_export: dynamic must be True or False, got {dynamic!r}")


def _notes(layout: ExportLayout, dynamic: bool, collectives: list[str], npu_ops: list[str],
           weights: str) -> list[str]:
    notes = [f"torchair dynamo_export: package {os.path.basename(layout.package)} "
             f"(AOTInductor), dynamic={dynamic}, rank={layout.rank}, weights={weights}",
             "Data kind=tensor: a model input (-1: dynamic dim); kind=parameter: a weight "
             "stored in the package"]
    if collectives:
        notes.append("collectives: " + ", ".join(collectives) + " (the loading process needs "
                     "the same process group world)")
    if npu_ops:
        notes.append("torchair npu ops: " + ", ".join(npu_ops) + " (the loading process "
                     "imports torchair)")
    return notes


def dynamo_export(*args: Any, model: torch.nn.Module, export_path: str = "export_file",
                  export_name: str = "export", dynamic: bool = False,
                  config: CompilerConfig | None = None, **kwargs: Any) -> str:
    """Export ``model(*args, **kwargs)`` as a package a deployment runs without the model's code.

    TorchAir's signature and file layout (see :mod:`torchair.export`): writes
    ``export_path/{export_name}.pt2`` (an AOTInductor package: the compiled graph and its
    weights) and ``export_path/dynamo.pbtxt`` (the readable graph); under a process group each
    rank writes ``export_path/{export_name}{rank}.pt2`` and
    ``export_path/rank_{rank}/dynamo.pbtxt``.
    ``dynamic=True`` keeps the dims Dynamo treats as dynamic dynamic in the package. Returns the
    package's path; load it with :func:`torchair.load_export`.
    """
    config = CompilerConfig() if config is None else config
    _check_args(model, config, dynamic)
    layout = layout_for(export_path, export_name)
    start = time.perf_counter()
    logger.info("dynamo_export: export_path: %s, export_name: %s, dynamic: %s, rank: %s",
                layout.export_path, layout.export_name, dynamic, layout.rank)
    with progress(f"dynamo_export: tracing {type(model).__name__} with Dynamo (torch.export)"):
        ep = trace(model, args, kwargs, dynamic=dynamic)
    npu_ops = check_ops(ep)
    collectives = collectives_in(ep)
    weights, weight_options = _weights_options(ep)
    record = bool(config.export.experimental.enable_record_nn_module_stack.value)
    text = _describe.render_export_pbtxt(
        ep, notes=_notes(layout, dynamic, collectives, npu_ops, weights),
        record_nn_module_stack=record)
    with open(layout.dump, "w", encoding="utf-8") as f:
        f.write(text)
    logger.info("dynamo_export: wrote the readable graph to %s", layout.dump)

    dist = torch.distributed
    world = dist.get_world_size() if layout.rank is not None else None
    spec = _describe.input_spec(ep, args, kwargs, dynamic=dynamic, rank=layout.rank,
                                world_size=world, weights=weights)
    options = {"aot_inductor.metadata": {_describe.SPEC_KEY: _describe.dumps(spec)},
               **weight_options}
    if os.path.exists(layout.package):
        os.remove(layout.package)  # a stale package is never left behind a failed compile
    with progress(f"dynamo_export: AOT-compiling {os.path.basename(layout.package)} with "
                  f"AOTInductor (C++ compile; tens of seconds on a few cores)"):
        with _inductor_dir(layout.rank):  # ranks never share a directory (see there)
            path = torch._inductor.aoti_compile_and_package(ep, package_path=layout.package,
                                                            inductor_configs=options)
    logger.info("dynamo_export: wrote %s in %.1f s", path, time.perf_counter() - start)
    return path
