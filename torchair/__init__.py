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
from torchair.plan.report import GraphReport, graph_reports

__version__ = "0.1.0"

# The compiler (backend, pipeline, passes, patterns) loads on first use, so a process that only
# runs cache_compile's warm entries never imports it (nor the sympy/decomposition machinery).
_LAZY = {"get_compiler": "torchair.core.backend", "get_npu_backend": "torchair.core.backend",
         "register_replacement": "torchair.patterns"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'torchair' has no attribute {name!r}")

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
