"""``load_export``: run an exported package without the model's Python code."""
from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch
import torch.utils._pytree as pytree

from torchair.base.log import logger
from torchair.export import _describe
from torchair.export._layout import PACKAGE_SUFFIX, current_rank

__all__ = ["ExportedModel", "load_export"]


def _resolve(path: str, export_name: str, rank: int | None) -> str:
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"load_export: {path!r} is neither a package file (.pt2) nor an "
                                f"export directory; pass what dynamo_export wrote (its "
                                f"export_path, or the .pt2 in it)")
    if rank is None:
        rank = current_rank()
    single = os.path.join(path, export_name + PACKAGE_SUFFIX)
    if rank is not None:
        ranked = os.path.join(path, f"{export_name}{rank}{PACKAGE_SUFFIX}")
        if os.path.isfile(ranked):
            return ranked
    if os.path.isfile(single):
        return single
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*" + PACKAGE_SUFFIX)))
    hint = (f"pass rank= (one of the per-rank packages {found})" if found and rank is None else
            f"pass export_name= matching one of {found}" if found else
            "run dynamo_export with this export_path first")
    want = f"{export_name}{rank}{PACKAGE_SUFFIX}" if rank is not None else \
        f"{export_name}{PACKAGE_SUFFIX}"
    raise FileNotFoundError(f"load_export: no package {want!r} in {path!r}: {hint}")


def _device_index(device: Any) -> int:
    if device is None:
        return -1
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cpu":
        return -1
    return -1 if dev.index is None else dev.index


class ExportedModel:
    """A loaded package: call it like the model (same positional and keyword arguments).

    Before every call the tensor arguments are checked against what was exported (dtype, rank,
    fixed dims, dynamic dims' ranges) and the non-tensor arguments against the constants the
    package baked in: AOTInductor itself does not check, and a wrong shape would run silently.
    """

    def __init__(self, path: str, runner: Any) -> None:
        self.path = path
        self._runner = runner
        self.metadata: dict[str, str] = dict(runner.get_metadata())
        raw = self.metadata.get(_describe.SPEC_KEY)
        self.spec: dict | None = json.loads(raw) if raw else None
        loader = getattr(runner, "loader", None)
        self._in_spec = (pytree.treespec_loads(loader.get_call_spec()[0])
                         if loader is not None else None)

    @property
    def device(self) -> str:
        return self.metadata.get("AOTI_DEVICE_KEY", "cpu")

    @property
    def dynamic(self) -> bool:
        return bool(self.spec and self.spec.get("dynamic"))

    def _check(self, args: tuple, kwargs: dict) -> None:
        if self.spec is None or self._in_spec is None:
            return  # not a torchair export (a plain AOTInductor package): nothing to check
        leaves = _describe.flat_leaves(args, kwargs, self._in_spec)
        expected = self.spec["inputs"]
        if len(leaves) != len(expected):
            raise ValueError(f"{os.path.basename(self.path)}: called with {len(leaves)} argument "
                             f"leaves, but the model was exported with {len(expected)}; pass the "
                             f"same arguments as at export")
        sizes: dict[str, tuple[int, int, int]] = {}  # dynamic dim symbol -> (size, arg, dim)
        for i, (value, want) in enumerate(zip(leaves, expected)):
            if "tensor" in want:
                self._check_tensor(i, value, want, sizes)
            elif not isinstance(value, torch.Tensor) and repr(value) != want["constant"] and \
                    not want["constant"].startswith("<"):
                raise ValueError(f"{os.path.basename(self.path)}: argument {i} is {value!r}, but "
                                 f"the package baked in {want['constant']} at export (non-tensor "
                                 f"arguments are constants); export again with this value")
            elif isinstance(value, torch.Tensor):
                raise TypeError(f"{os.path.basename(self.path)}: argument {i} is a tensor, but "
                                f"the model was exported with the constant {want['constant']}")

    def _check_tensor(self, i: int, value: Any, want: dict, sizes: dict) -> None:
        name = os.path.basename(self.path)
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: argument {i} must be a {want['tensor']} tensor, got "
                            f"{type(value).__name__}")
        dtype = str(value.dtype).replace("torch.", "")
        shape = want["shape"]
        if dtype != want["tensor"] or value.dim() != len(shape):
            raise ValueError(f"{name}: argument {i} is {dtype}{list(value.shape)}, but the "
                             f"package takes {want['tensor']}{self._shape_text(shape)}")
        for d, (size, dim) in enumerate(zip(value.shape, shape)):
            if isinstance(dim, int) and size != dim:
                fix = ("export with dynamic=True to vary it" if not self.dynamic else
                       "the trace fixed it (the model needs this size); export at this size")
                raise ValueError(f"{name}: argument {i} has size {size} in dim {d}, but the "
                                 f"package was compiled for {dim} ({want['tensor']}"
                                 f"{self._shape_text(shape)}); {fix}")
            if isinstance(dim, list):
                low, high, symbol = dim
                if size < low or (high is not None and size > high):
                    raise ValueError(f"{name}: argument {i} has size {size} in dim {d}, outside "
                                     f"the exported range [{low}, "
                                     f"{high if high is not None else 'inf'}]")
                first = sizes.setdefault(symbol, (size, i, d))
                if first[0] != size:
                    raise ValueError(f"{name}: argument {i} has size {size} in dim {d}, but "
                                     f"argument {first[1]} has {first[0]} in dim {first[2]}; the "
                                     f"trace found these dims equal ({symbol}): pass equal sizes")

    @staticmethod
    def _shape_text(shape: list) -> str:
        return "[" + ", ".join(str(d) if isinstance(d, int) else "-1" for d in shape) + "]"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return self._runner(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ExportedModel({self.path!r}, device={self.device!r}, dynamic={self.dynamic})"


def load_export(path: str | os.PathLike = "export_file", *, export_name: str = "export",
                rank: int | None = None, device: Any = None) -> ExportedModel:
    """Load what :func:`torchair.dynamo_export` wrote, in any process: no model code needed.

    ``path`` is the export directory (``export_path``) or a ``.pt2`` in it. In a directory the
    package is ``{export_name}.pt2``, or ``{export_name}{rank}.pt2`` for per-rank exports
    (``rank`` defaults to this process's ``torch.distributed`` rank). ``device`` picks the CUDA
    device of a CUDA package (``"cuda:1"``, ``1``); a package runs on the device type it was
    exported for. A package with collectives needs the same process group world as at export
    (``init_process_group`` before calling it). Returns an :class:`ExportedModel`.
    """
    import torchair.ops  # noqa: F401 - registers the npu ops a package may call

    pkg = _resolve(os.fspath(path), export_name, rank)
    index = _device_index(device)
    # device_index only when one is asked for (older PyTorch's loader may not take it)
    runner = (torch._inductor.aoti_load_package(pkg) if index == -1 else
              torch._inductor.aoti_load_package(pkg, device_index=index))
    model = ExportedModel(pkg, runner)
    if device is not None:
        want = torch.device(device if not isinstance(device, int) else f"cuda:{device}").type
        if want != torch.device(model.device).type:
            raise ValueError(f"load_export: {os.path.basename(pkg)} was compiled for "
                             f"{model.device}, device={device!r} asked for {want}; export on a "
                             f"{want} model to run there")
    logger.info("load_export: loaded %s (%s, dynamic=%s)", pkg, model.device, model.dynamic)
    return model
