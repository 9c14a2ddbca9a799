"""torchair: TorchAir's graph-mode ``torch.compile`` backend for CPU and CUDA GPUs.

    import torchair
    config = torchair.CompilerConfig()
    config.experimental_config.tiling_schedule_optimize = True
    model = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config),
                          dynamic=True, fullgraph=True)
    torchair.graph_reports()[-1]   # static or not, and why
"""
from torchair import inference, ops, scope
from torchair.configs.compiler_config import CompilerConfig
from torchair.core.backend import get_compiler, get_npu_backend
from torchair.patterns import register_replacement
from torchair.plan.report import GraphReport, graph_reports

__version__ = "0.1.0"

__all__ = [
    "CompilerConfig",
    "GraphReport",
    "get_compiler",
    "get_npu_backend",
    "graph_reports",
    "inference",
    "ops",
    "register_replacement",
    "scope",
]
