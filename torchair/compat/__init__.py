"""Run scripts written for Ascend (``torch_npu`` + TorchAir) unchanged on CPU or CUDA.

    from torchair.compat import emulate_npu
    with emulate_npu():            # or emulate_npu() ... torchair.compat.restore()
        import torch_npu
        y = torch_npu.npu_rms_norm(torch.randn(2, 8, device="npu:0"), torch.ones(8).npu())[0]
        s = torch.npu.Stream()     # streams, events, seeds, memory queries: see _npu_namespace

or from the shell: ``torchair run [--device cpu|cuda] script.py [args...]``.

Importing this package patches nothing; only :func:`emulate_npu` does, and only when the real
``torch_npu`` cannot be imported.
"""
from torchair.compat._errors import NotEmulatedError
from torchair.compat._torch_npu import npu_format_cast
from torchair.compat.emulation import Emulation, emulate_npu, is_emulated, restore
from torchair.compat.runner import run_script

__all__ = ["Emulation", "NotEmulatedError", "emulate_npu", "is_emulated", "npu_format_cast",
           "restore", "run_script"]
