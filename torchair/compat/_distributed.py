"""``torch.distributed`` for Ascend scripts: HCCL played by gloo (CPU) or NCCL (CUDA).

Installed by :func:`~torchair.compat.emulate_npu` and undone by its ``restore()``:

- ``torch.distributed.init_process_group`` and ``new_group`` (also in ``distributed_c10d``,
  where torch's own helpers look them up) accept ``backend="hccl"`` and device-qualified strings
  such as ``"cpu:gloo,npu:hccl"``: ``hccl`` becomes ``gloo`` on a CPU emulation and ``nccl`` on
  CUDA. A missing ``timeout`` becomes ``$TORCHAIR_DIST_TIMEOUT`` seconds (default 300), so a
  rank blocked in a collective fails instead of waiting forever. An ``init_process_group`` that
  needs the launcher's environment (RANK, WORLD_SIZE) and finds none says to use
  ``torchair run --nproc-per-node N``; one whose ``world_size`` / ``rank`` contradict the
  launcher's ``$WORLD_SIZE`` / ``$RANK`` fails at once naming both (instead of waiting out the
  rendezvous timeout). A gloo group also registers the exit drain of
  :mod:`torchair.distributed.quiesce` (gloo's workers done before Python finalizes).
- ``torch_npu.distributed`` (a module, also importable) forwards to ``torch.distributed``;
  ``torch_npu``-only names (:data:`NPU_ONLY`) raise ``NotEmulatedError`` naming the call.

Collectives (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single``, ``broadcast``, ``barrier`` ...) are torch.distributed's own: tensors made
with ``device="npu"`` are already on the emulated device.
"""
from __future__ import annotations

import datetime
import functools
import importlib.machinery
import os
import types
from typing import Any, Callable

import torch

from torchair.base.log import logger
from torchair.compat._errors import NotEmulatedError
from torchair.distributed.quiesce import drain_at_exit_for

__all__ = ["NPU_ONLY", "default_timeout", "distributed_patches", "make_torch_npu_distributed",
           "map_backend"]

# torch_npu.distributed names with no torch.distributed counterpart (HCCL-specific features)
NPU_ONLY = ("is_hccl_feature_supported", "reinit_process_group", "all_gather_into_tensor_uneven",
            "reduce_scatter_tensor_uneven", "Reducer", "_register_comm_hook",
            "_register_builtin_comm_hook", "_compute_bucket_assignment_by_size",
            "_verify_params_across_processes", "_broadcast_coalesced")
_TIMEOUT_ENV = "TORCHAIR_DIST_TIMEOUT"
_DEFAULT_TIMEOUT_S = 300.0
_logged: set[tuple[str, str]] = set()


def default_timeout() -> datetime.timedelta:
    """The timeout given to process groups created without one: ``$TORCHAIR_DIST_TIMEOUT``
    seconds (default 300)."""
    raw = os.environ.get(_TIMEOUT_ENV, "")
    if not raw:
        return datetime.timedelta(seconds=_DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{_TIMEOUT_ENV}={raw!r} is not a timeout; expected a positive number "
                         "of seconds (e.g. 300), or unset it for the default of 300 s")
    return datetime.timedelta(seconds=seconds)


def map_backend(backend: Any, target: torch.device, nccl: bool = False) -> Any:
    """``backend`` with HCCL replaced by the emulated device's backend.

    "hccl" -> "gloo" (CPU) or "nccl" (CUDA); "cpu:gloo,npu:hccl" -> "cpu:gloo" (CPU) or
    "cpu:gloo,cuda:nccl" (CUDA). With ``nccl`` (a CPU emulation after ``transfer_to_npu``, which
    makes NCCL mean HCCL), "nccl" and "cuda:nccl" are HCCL too. Any other value (None, "gloo", a
    Backend) is returned unchanged.
    """
    if nccl and isinstance(backend, str) and "nccl" in backend.lower():
        backend = backend.lower().replace("cuda:", "npu:").replace("nccl", "hccl")
    if not isinstance(backend, str) or "hccl" not in backend.lower():
        return backend
    real = "gloo" if target.type == "cpu" else "nccl"
    if ":" not in backend:
        if backend.strip().lower() != "hccl":
            raise ValueError(f"torch.distributed backend={backend!r} is not understood; expected "
                             "'hccl', 'gloo', 'nccl' or 'device:backend,...' pairs such as "
                             "'cpu:gloo,npu:hccl'")
        return real
    pairs: dict[str, str] = {}
    for item in backend.split(","):
        device, sep, name = (part.strip().lower() for part in item.partition(":"))
        if not sep or not device or not name:
            raise ValueError(f"torch.distributed backend={backend!r}: {item!r} is not a "
                             "'device:backend' pair; expected e.g. 'cpu:gloo,npu:hccl'")
        if device == "npu":
            device = target.type
        if name == "hccl":
            name = real
        pairs.setdefault(device, name)  # on CPU, "cpu:gloo" and "npu->cpu:gloo" coincide
    return ",".join(f"{device}:{name}" for device, name in pairs.items())


def _log_mapping(backend: Any, mapped: Any) -> None:
    key = (str(backend), str(mapped))
    if mapped != backend and key not in _logged:
        _logged.add(key)
        logger.info("torch.distributed backend %r is played by %r (torch_npu emulation)",
                    backend, mapped)


def _check_launcher_env(init_method: Any, store: Any, rank: int, world_size: int) -> None:
    """Raise the launcher hint when torch would read RANK / WORLD_SIZE and they are missing."""
    if store is not None or init_method not in (None, "env://"):
        return
    missing = [name for name, given in (("RANK", rank), ("WORLD_SIZE", world_size))
               if given == -1 and name not in os.environ]
    if missing:
        raise RuntimeError(
            "torch.distributed.init_process_group(backend='hccl'): "
            f"{' and '.join(missing)} not set, so this process was not started by a launcher. "
            "Start the ranks with `torchair run --nproc-per-node N script.py` (N >= 2; it uses "
            "torch.distributed.run), or pass rank=, world_size= and an init_method or store.")


def _check_launcher_world(init_method: Any, store: Any, rank: int, world_size: int) -> None:
    """Fail at once when ``rank`` / ``world_size`` contradict the launcher's ``$RANK`` /
    ``$WORLD_SIZE``: torch's env:// rendezvous would wait its whole timeout for ranks that never
    come (or a rank slot taken twice) and then report a store key."""
    if store is not None or init_method not in (None, "env://"):
        return
    env_world, env_rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if env_world is None or not env_world.isdigit():
        return
    launched = int(env_world)
    where = ("torch.distributed.init_process_group: this process was started as one of "
             f"$WORLD_SIZE={launched} ranks (torchair run --nproc-per-node {launched}, or "
             "another launcher)")
    if world_size != -1 and world_size != launched:
        raise RuntimeError(
            f"{where}, but the script passes world_size={world_size}; the rendezvous would wait "
            f"for {world_size} ranks that never all come. Pass world_size={launched} (or leave "
            f"it out to read $WORLD_SIZE), or launch --nproc-per-node {world_size}.")
    if rank == -1:
        return
    if rank < 0 or rank >= launched:
        raise RuntimeError(f"{where}, but the script passes rank={rank}, outside "
                           f"0..{launched - 1}. Pass rank=int(os.environ['RANK']) or leave it "
                           "out.")
    if env_rank is not None and env_rank.isdigit() and rank != int(env_rank):
        raise RuntimeError(f"{where}, but the script passes rank={rank} while the launcher "
                           f"started this process as $RANK={env_rank}; two processes would "
                           "claim one rank. Pass rank=int(os.environ['RANK']) or leave it out.")


def _drain_gloo_at_exit(group: Any) -> None:
    """Register :func:`~torchair.distributed.quiesce.drain_at_exit` when ``group`` (None: the
    default group) runs on gloo, whose worker threads must be done before Python finalizes."""
    import torch.distributed.distributed_c10d as c10d

    try:
        backend = c10d.get_backend(group)
    except Exception:  # noqa: BLE001 - not a member, no default group: never fail the call
        return
    drain_at_exit_for(backend)


def _wrap_init(original: Callable[..., Any], target: torch.device,
               nccl: Callable[[], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(backend: Any = None, init_method: Any = None,
                           timeout: datetime.timedelta | None = None, world_size: int = -1,
                           rank: int = -1, store: Any = None, *args: Any,
                           **kwargs: Any) -> None:
        mapped = map_backend(backend, target, nccl())
        if mapped != backend:
            _check_launcher_env(init_method, store, rank, world_size)
            _log_mapping(backend, mapped)
        _check_launcher_world(init_method, store, rank, world_size)
        if target.type == "cpu" and kwargs.get("device_id") is not None:
            kwargs["device_id"] = None  # gloo binds no device; "npu:i" means the CPU here
        done = original(mapped, init_method, default_timeout() if timeout is None else timeout,
                        world_size, rank, store, *args, **kwargs)
        _drain_gloo_at_exit(None)
        return done
    return init_process_group


def _wrap_new_group(original: Callable[..., Any], target: torch.device,
                    nccl: Callable[[], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def new_group(ranks: Any = None, timeout: datetime.timedelta | None = None,
                  backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        mapped = map_backend(backend, target, nccl())
        _log_mapping(backend, mapped)
        if target.type == "cpu" and kwargs.get("device_id") is not None:
            kwargs["device_id"] = None
        group = original(ranks, default_timeout() if timeout is None else timeout, mapped,
                         *args, **kwargs)
        _drain_gloo_at_exit(group)
        return group
    return new_group


def distributed_patches(target: torch.device, nccl: Callable[[], bool] = lambda: False
                        ) -> list[tuple[Any, str, Any]]:
    """``(owner, name, value)`` patches for ``torch.distributed`` on ``target``; empty when
    torch was built without distributed support. ``nccl()`` says whether NCCL means HCCL now
    (see :func:`map_backend`)."""
    if not torch.distributed.is_available():
        return []
    import torch.distributed.distributed_c10d as c10d

    init = _wrap_init(c10d.init_process_group, target, nccl)
    new_group = _wrap_new_group(c10d.new_group, target, nccl)
    return [(owner, name, value) for owner in (torch.distributed, c10d)
            for name, value in (("init_process_group", init), ("new_group", new_group))]


def _npu_only(name: str) -> NotEmulatedError:
    return NotEmulatedError(
        f"torch_npu.distributed.{name} is HCCL-only and not emulated by torchair run; "
        "torch_npu.distributed forwards to torch.distributed (process groups with "
        "backend='hccl', all_reduce, all_gather_into_tensor, reduce_scatter_tensor, "
        "all_to_all_single, broadcast, barrier, ...). Remove the call or guard it for "
        "non-Ascend runs.")


def make_torch_npu_distributed() -> types.ModuleType:
    """The ``torch_npu.distributed`` module: torch.distributed's names, NPU_ONLY ones raise."""
    mod = types.ModuleType("torch_npu.distributed",
                           "torch_npu.distributed emulated by torchair: torch.distributed")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu.distributed", None)
    mod.is_available = torch.distributed.is_available

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module 'torch_npu.distributed' has no attribute {name!r}")
        if name in NPU_ONLY or not hasattr(torch.distributed, name):
            raise _npu_only(name)
        return getattr(torch.distributed, name)  # looked up per call: sees the emulation's

    mod.__getattr__ = __getattr__
    return mod
