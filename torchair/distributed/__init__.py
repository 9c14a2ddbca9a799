"""Collectives in compiled graphs: :func:`patch_for_hcom` (exported as
``torchair.patch_for_hcom``) and :func:`unpatch_for_hcom`. See :mod:`torchair.distributed.hcom`."""
from torchair.distributed.hcom import patch_for_hcom, patched_for_hcom, unpatch_for_hcom

__all__ = ["patch_for_hcom", "patched_for_hcom", "unpatch_for_hcom"]
