"""Models the export tests export. Only the exporting processes import this module: the
processes that load the packages never do (that is what the tests check)."""
from __future__ import annotations

import torch
import torch.distributed as dist


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.nn.functional.silu(self.proj(x))


class TinyModel(torch.nn.Module):
    """[batch, seq, 8] inputs; a keyword tensor and an int constant; a nested module."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = Block(width)
        self.register_buffer("bias", torch.linspace(-1, 1, width))

    def forward(self, x, y=None, scale: int = 2):
        out = self.block(x) * scale + self.bias
        return out if y is None else out + y.softmax(-1)


class AllReduceModel(torch.nn.Module):
    """TorchAir's export test model: add, a weight, then an in-place all_reduce ([n, 2] inputs;
    n is dynamic under dynamic=True)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([1.5, 3.5]))
        # a matrix too: AOTInductor folds a lone [2] weight into its kernel, and a package whose
        # weight blob is empty fails to load (mmap of 0 bytes)
        self.w = torch.nn.Parameter(torch.tensor([[1.0, 0.5], [-0.5, 2.0]]))

    def forward(self, x, y):
        x = (x + y + self.p) @ self.w
        dist.all_reduce(x)
        return x * 2

    @torch.no_grad()
    def expected(self, n: int, world: int) -> torch.Tensor:
        """forward's result when rank r passes ``x = ones(n, 2) * (r + 1)``, ``y = 0.5``: the
        sum over ranks computed here, without a collective."""
        return sum((torch.ones(n, 2) * (r + 1) + 0.5 + self.p) @ self.w for r in range(world)) * 2
