"""Where an export's files go: TorchAir's layout, with an AOTInductor package for its ``.air``.

TorchAir (``_utils/export_utils.py``) writes, without a process group::

    export_path/{export_name}.air       the model        -> here {export_name}.pt2
    export_path/dynamo.pbtxt            readable graph   -> here the same name
    export_path/<weight files>          only weights over 2 GB - 200 MB

and under a process group (one export per rank, ``rank`` = ``torch.distributed.get_rank()``)::

    export_path/{export_name}{rank}.air -> here {export_name}{rank}.pt2
    export_path/rank_{rank}/dynamo.pbtxt
"""
from __future__ import annotations

import dataclasses
import os

import torch

__all__ = ["DUMP_NAME", "PACKAGE_SUFFIX", "ExportLayout", "current_rank", "layout_for"]

DUMP_NAME = "dynamo.pbtxt"
PACKAGE_SUFFIX = ".pt2"


@dataclasses.dataclass(frozen=True)
class ExportLayout:
    """The files one ``dynamo_export`` call writes."""

    export_path: str
    export_name: str
    rank: int | None  # None: no process group

    @property
    def package(self) -> str:
        suffix = "" if self.rank is None else str(self.rank)
        return os.path.join(self.export_path, f"{self.export_name}{suffix}{PACKAGE_SUFFIX}")

    @property
    def rank_dir(self) -> str:
        if self.rank is None:
            return self.export_path
        return os.path.join(self.export_path, f"rank_{self.rank}")

    @property
    def dump(self) -> str:
        return os.path.join(self.rank_dir, DUMP_NAME)


def current_rank() -> int | None:
    """This process's rank when a default process group exists, else None (TorchAir's test)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def _refuse_symlink(path: str, what: str) -> None:
    if os.path.islink(os.path.abspath(path)):
        raise ValueError(f"dynamo_export: {what} {os.path.abspath(path)!r} is a symbolic link; "
                         f"TorchAir refuses to write through links: pass a real directory")


def layout_for(export_path: str | os.PathLike, export_name: str) -> ExportLayout:
    """Check the arguments as TorchAir does (last path part of ``export_name``, no symbolic
    links) and return the layout for this process's rank; creates the directories."""
    if not isinstance(export_path, (str, os.PathLike)) or not os.fspath(export_path):
        raise TypeError(f"dynamo_export: export_path must be a non-empty str or os.PathLike "
                        f"(a directory, created when missing), got {export_path!r}")
    if not isinstance(export_name, str):
        raise TypeError(f"dynamo_export: export_name must be a str (the package's file name "
                        f"without suffix, e.g. 'export'), got {type(export_name).__name__}")
    name = os.path.split(export_name)[-1]  # TorchAir keeps the last part only
    if not name:
        raise ValueError(f"dynamo_export: export_name={export_name!r} has no file name; pass "
                         f"a name such as 'export'")
    path = os.fspath(export_path)
    _refuse_symlink(path, "export_path")
    layout = ExportLayout(path, name, current_rank())
    _refuse_symlink(layout.package, "the package file")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"dynamo_export: export_path {path!r} exists and is not a directory; "
                         f"pass a directory (created when missing)")
    os.makedirs(layout.rank_dir, exist_ok=True)
    return layout
