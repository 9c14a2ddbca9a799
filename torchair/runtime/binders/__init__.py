"""Binders: the rewrites that put torchair's C++ kernels into a CPU static unit's graph.

A static unit (:mod:`torchair.runtime.units`) builds its engine from a copy of the traced graph
in which the calls that a native kernel serves call that kernel instead of the general op. Each
binder is a callable ``binder(gm) -> (graph, count)`` that never changes ``gm`` (the compile
cache keeps the traced graph with the general ops):

* ``attention.py``: :class:`~torchair.runtime.binders.attention.AttentionBinder`, attention
  calls -> the launch kernels ``torchair_native::ifa_decode`` / ``fia_prompt``
  (:mod:`torchair.ops.attention.cpu.launch_library`).
* ``small_products.py``: :class:`~torchair.runtime.binders.small_products.SmallProductBinder`,
  few-row ``mm``/``addmm`` -> ``torchair_native::gemv`` (:mod:`torchair.ops.matmul.cpu`).

They are not passes (:class:`torchair.passes.GraphPass` rewrites a graph in place and returns a
count): they run at a unit's build, below the pass pipeline, and return a new graph.
"""
from torchair.runtime.binders.attention import AttentionBinder
from torchair.runtime.binders.small_products import SmallProductBinder

__all__ = ["AttentionBinder", "SmallProductBinder"]
