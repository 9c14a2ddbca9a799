"""``import torchair.ge_concrete_graph.ge_converter.experimental.patch_for_hcom_allreduce``.

TorchAir scripts (DeepSpeed and vllm-ascend's graph mode among them) import this module so that
``torch.distributed.all_reduce`` & co. trace into graphs; importing it has the effect of
:func:`torchair.patch_for_hcom` (idempotent: scripts that also call ``torchair.patch_for_hcom()``
get the same state). :func:`torchair.distributed.unpatch_for_hcom` undoes it.
"""
from torchair.distributed import hcom as _hcom

_hcom.patch_for_hcom()
