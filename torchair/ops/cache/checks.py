"""The argument checks both cache-write ops share (dtypes of ``self``, ``updates``, ``indices``)."""
from __future__ import annotations

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


def check_write_dtypes(op: str, self: torch.Tensor, indices: torch.Tensor,
                       updates: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    """``self`` of one of ``dtypes``, ``updates`` of ``self``'s dtype, int32 / int64 ``indices``."""
    if self.dtype not in dtypes:
        raise TypeError(f"{op}: self has dtype {self.dtype}; expected one of {list(dtypes)}")
    if updates.dtype != self.dtype:
        raise TypeError(f"{op}: updates has dtype {updates.dtype} but self has {self.dtype}; "
                        f"cast updates to {self.dtype}")
    if indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: indices has dtype {indices.dtype}; expected int32 or int64")
