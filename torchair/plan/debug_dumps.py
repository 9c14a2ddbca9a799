"""``debug.data_dump`` (per-op ``.npy`` files each step) and ``debug.fx_summary`` (a CSV of a
graph's ops), TorchAir's debugging aids.

Data dump layout, as TorchAir's documentation gives it::

    <path>/worldsize<W>_global_rank<R>/graph_<N>/<step>/<node>-<op>.INPUT.<i>[.<j>].<ts>.npy
                                                        <node>-<op>.OUTPUT.<i>.<ts>.npy

``<step>`` counts the graph's calls from 0; ``<ts>`` is one UTC timestamp per op call
(``%Y%m%d%H%M%S%f``); ``<op>`` is the ATen overload (``aten.add.Tensor``); list arguments save
one file per element (``.<j>``); keyword arguments are not saved; bfloat16 is saved as float32
(numpy has no bfloat16). Only ATen / custom op calls are dumped (not ``getitem``).
"""
from __future__ import annotations

import collections
import csv
import datetime
import os
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchair.base.log import logger
from torchair.plan.dump import make_dump_dir

__all__ = ["DataDumpRunner", "rank_dir_name", "write_fx_summary"]


def _timestamp() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y%m%d%H%M%S%f")


def rank_dir_name() -> str:
    """``worldsize<W>_global_rank<R>`` (1 and 0 without an initialized process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return f"worldsize{dist.get_world_size()}_global_rank{dist.get_rank()}"
    return "worldsize1_global_rank0"


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _to_numpy(value: Any):
    import numpy as np

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    try:
        return np.array(value)
    except Exception:  # noqa: BLE001 - anything numpy cannot hold is saved as its text
        return np.array(str(value))


class DataDumpRunner:
    """Runs a graph op by op (``torch.fx.Interpreter``) and saves each op's inputs and outputs
    per call (see the module doc). ``node_filter(node)`` returns the node to name the files
    after, or None to skip it."""

    def __init__(self, gm: fx.GraphModule, graph_id: int, path: str | None,
                 node_filter: Callable[[fx.Node], Any] | None = None) -> None:
        if node_filter is not None and not callable(node_filter):
            raise TypeError(f"debug.data_dump.filter must be a callable(node) -> node or None, "
                            f"got {type(node_filter).__name__}")
        self.gm = gm
        self.root = os.path.join(os.path.realpath(path or "."), rank_dir_name(),
                                 f"graph_{graph_id}")
        self.filter = node_filter
        self.step = 0

    def __call__(self, args: list) -> Sequence[Any]:
        directory = os.path.join(self.root, str(self.step))
        make_dump_dir(directory, "debug.data_dump.path")
        runner = _Dumper(self.gm, directory, self.filter)
        out = runner.run(*args)
        logger.debug("data dump of step %d: %d files in %s", self.step, runner.files, directory)
        self.step += 1
        return out


class _Dumper(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, directory: str, node_filter: Any) -> None:
        super().__init__(gm)
        self.directory = directory
        self.node_filter = node_filter
        self.files = 0

    def _save(self, stem: str, value: Any) -> None:
        import numpy as np

        np.save(os.path.join(self.directory, stem + ".npy"), _to_numpy(value))
        self.files += 1

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function" or not isinstance(n.target, (torch._ops.OpOverload,
                                                                torch._ops.OpOverloadPacket)):
            return super().run_node(n)
        named = n if self.node_filter is None else self.node_filter(n)
        if named is None:
            return super().run_node(n)
        args, _ = self.fetch_args_kwargs_from_env(n)
        ts = _timestamp()
        prefix = f"{getattr(named, 'name', n.name)}-{n.target}"
        for i, arg in enumerate(args):
            if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
                for j, item in enumerate(arg):
                    self._save(f"{prefix}.INPUT.{i}.{j}.{ts}", item)
            else:
                self._save(f"{prefix}.INPUT.{i}.{ts}", arg)
        result = super().run_node(n)
        for i, item in enumerate(result if isinstance(result, (list, tuple)) else [result]):
            self._save(f"{prefix}.OUTPUT.{i}.{ts}", item)
        return result


def _meta_text(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_meta_text(v) for v in value) + "]"
    return type(value).__name__


def write_fx_summary(gm: fx.GraphModule, graph_id: int, path: str | None) -> str:
    """One CSV row per op target of ``gm``: ``op, count, first_node, input_meta, output_meta``
    (dtype and shape of the first call's tensors). Returns the file's path."""
    directory = os.path.realpath(path or ".")
    make_dump_dir(directory, "debug.fx_summary.path")
    name = f"summary_graph_{graph_id}_rank_{_rank()}_pid_{os.getpid()}_ts_{_timestamp()}.csv"
    counts: collections.Counter = collections.Counter()
    first: dict[str, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            key = str(node.target)
            counts[key] += 1
            first.setdefault(key, node)
    file = os.path.join(directory, name)
    with open(file, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["op", "count", "first_node", "input_meta", "output_meta"])
        for key, count in counts.items():
            node = first[key]
            inputs = [_meta_text(a.meta.get("val")) if isinstance(a, fx.Node) else repr(a)
                      for a in node.args]
            writer.writerow([key, count, node.name, "; ".join(inputs),
                             _meta_text(node.meta.get("val"))])
    logger.info("fx summary of graph %d: %s", graph_id, file)
    return file
