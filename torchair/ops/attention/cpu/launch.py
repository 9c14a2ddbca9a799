"""Launch kernels: torchair's ops as C++ dispatcher kernels that static units call without Python.

A static launch unit has fixed shapes, so everything its attention call needs besides the data
(checks of shapes and layouts, the kernel, its strides) is decided once.
``toolchain/csrc/launch_ops.cpp`` (built on first use by :mod:`torchair.ops.toolchain.native`
against this process's torch, cached the same safe way as the C kernels) registers the operator

    torchair_native::ifa_decode(query, key, value, actual_seq_lengths, ends, block_table,
                                num_heads, num_key_value_heads, layout, block_size, scale_value,
                                defer_errors, host_lengths)

with PyTorch's dispatcher: a C++ function that reads shapes and strides from the tensors, checks
the lengths and the block ids it reads (the general op's ``ValueError`` texts) and calls the
native decode kernel (``toolchain/csrc/decode_attention.c``). Inductor's generated code, its C++
wrapper and AOTInductor libraries call it like any ATen op; a call costs the dispatcher's few
microseconds, not the general op's Python.

:func:`bind_static_unit` rewrites, in a CPU static unit's FX graph, each
``npu_incre_flash_attention_tensor`` call that the kernel can serve (decode: one query token, no
mask, pse_shift, antiquant or output quantization; the general op's shape validation passes for
the unit's fixed shapes; the kernel takes the shapes and strides) into that operator, with
``defer_errors=True``: a bad length or block id is kept and the call returns zeros, and the unit
(wrapped by :func:`checked`) raises it after the run as the ``ValueError`` eager raises.

``npu_fused_infer_attention_score_tensor`` decode calls that are IFA calls in disguise (one query
token, every argument IFA does not have at its default, the lse output unused, FIA's own
validation passing) are bound the same way in units that do not also call IFA, so that
:func:`checked` can word a deferred error as FIA does (:func:`fia_errors`). Every other FIA call
the kernel computes exactly as FIA's dense formula (prompt calls with any number of query
tokens, sparse modes 0-4, with an atten_mask in modes 0/1 when it is the same for every head,
query lengths; no pse_shift, antiquant, output quantization, padding or lse output) is bound to
``torchair_native::fia_prompt``: each query token a row of the decode kernel with its own window
of KV positions (and its row of the mask), FIA's value checks and
error texts in C++ (:func:`_fia_prompt_args`); so are such ``npu_fused_infer_attention_score_v2``
calls with the output in the query's layout, their errors in v2's names (:func:`_fia_v2_as_v1`).

Lengths that were host lists in the traced call (slices of the unit's sunk scalar buffer) are
checked as eager checks host lists (``host_lengths``): against a paged cache's block table and
block count, and query lengths against ``S_q``.

The same library is also the CPU kernel of ``npu_incre_flash_attention`` and its tensor twin
themselves (registered at the CPU dispatch key, ahead of the Python kernel registered for every
device): a call whose signature the general op has validated once runs the decode kernel
without entering Python; everything else goes to the general op, registered for that purpose as
``torchair_native::ifa_general[_tensor]``. The Python fast path
(:mod:`torchair.ops.attention.ifa_fast`) calls ``ifa_decode`` with window ends it has checked.

Before a library is first used on a machine, a child process checks that its errors reach
Python (:func:`errors_reach_python`): on one lent GPU host (Ubuntu, Python 3.12, torch 2.11, that
host's compiler) every ValueError raised by the library killed the process with SIGSEGV, while
the same code passes on this project's machines. A library that fails the check is not used; the
verdict is kept beside it in the kernel cache.

Nothing here is required: without a C++ compiler (``$CXX``, default ``c++``), with
``TORCHAIR_NATIVE_KERNELS=0`` or without the C kernel, :func:`available` is False and the units
keep the general op.
"""
from __future__ import annotations

import ctypes
import operator
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import torch
import torch.fx as fx

from torchair.core.utils import logger
from torchair.ops.attention.cpu import native as _decode_native
from torchair.ops.toolchain import native as _native
from torchair.plan.sink import sunk_slots

__all__ = ["LAYOUTS", "available", "bind_static_unit", "checked", "ifa_decode", "loaded",
           "pending", "raise_pending"]

LAYOUTS = {"BSH": 0, "BNSD": 1, "BSND": 2}
_SYMBOLS = ("torchair_launch_set_decode", "torchair_launch_register",
            "torchair_launch_take_error", "torchair_launch_set_eager", "torchair_launch_clear",
            "torchair_launch_pending")
# keyword arguments of npu_incre_flash_attention_tensor that the launch kernel takes
_TAKEN = {"actual_seq_lengths", "block_table", "num_heads", "scale_value", "input_layout",
          "num_key_value_heads", "block_size", "inner_precise"}
_fake_lib: Any = None
_lib: Any = None  # the loaded library (ctypes)
_take_error: Any = None  # its torchair_launch_take_error
_pending: Any = None  # its torchair_launch_pending (ctypes.c_int): threads holding an error
_tls = threading.local()  # .buf: this thread's buffer for a deferred error's text


def available() -> bool:
    """Whether ``torch.ops.torchair_native.ifa_decode`` is registered (built on first call)."""
    return _native.enabled() and _load()


_load_lock = threading.Lock()
_load_result: bool | None = None


def _load() -> bool:
    """Load, check and register the library once per process (threads wait for the first)."""
    global _load_result
    if _load_result is None:
        with _load_lock:
            if _load_result is None:
                _load_result = _load_now()
    return _load_result


def _load_now() -> bool:
    global _fake_lib, _take_error, _lib, _pending
    if not _decode_native.available():
        return False
    lib = _native.load("launch_ops", symbols=_SYMBOLS)
    if lib is None or not errors_reach_python(lib._name):
        return False
    lib.torchair_launch_set_decode.argtypes = [ctypes.c_void_p]
    lib.torchair_launch_set_decode(ctypes.cast(_decode_native.kernel(), ctypes.c_void_p))
    from torchair.ops import _registry

    npu_entry = all(_registry.defined_here(name) for name in _IFA_OPS)
    _define_general()  # ifa_decode's fallback calls it too
    err = ctypes.create_string_buffer(4096)
    lib.torchair_launch_register.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    if lib.torchair_launch_register(int(npu_entry), err, len(err)) != 0:
        logger.warning("launch kernels could not be registered with the dispatcher (%s); static "
                       "units call the general ops", err.value.decode(errors="replace"))
        return False
    _fake_lib = torch.library.Library("torchair_native", "FRAGMENT")
    torch.library.register_fake("torchair_native::ifa_decode", _ifa_decode_fake, lib=_fake_lib)
    torch.library.register_fake("torchair_native::fia_prompt", _fia_prompt_fake, lib=_fake_lib)
    lib.torchair_launch_take_error.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.torchair_launch_set_eager.argtypes = [ctypes.c_int]
    _pending = ctypes.c_int.in_dll(lib, "torchair_launch_pending")
    _take_error = lib.torchair_launch_take_error
    _lib = lib
    return True


_IFA_OPS = ("npu_incre_flash_attention", "npu_incre_flash_attention_tensor")

PROBE_ENV = "TORCHAIR_LAUNCH_PROBE"  # in the checking child: the library it must load
PROBE_TIMEOUT_S = 180.0
_PROBE_CODE = "from torchair.ops.attention.cpu import launch; launch._probe()"
_PROBE_FAILED = 3  # the child's exit status when an error path misbehaved without crashing
_PROBE_OTHER_LIBRARY = 4  # ... when it loaded another library than the one to check
# what a broken error path does to the child; anything else (a timeout, SIGKILL from an OOM
# killer, Ctrl-C, a child that cannot import torchair) says nothing about the library
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE}


def errors_reach_python(library: str) -> bool:
    """Whether the library's error path works here: a bad length raises ``ValueError`` in a
    child process (an exception thrown by the library through PyTorch's dispatcher) and a
    deferred one is kept. Checked once per library build, one process at a time; the verdict
    ("ok", or how the child failed) is kept in ``<library>.errors`` beside it. A check that says
    nothing about the library (a timeout, a child that could not start) keeps no verdict: this
    process does without the library and the next one checks again."""
    if os.environ.get(PROBE_ENV):
        return True
    path = pathlib.Path(library + ".errors")
    try:
        with _native._locked(path.with_name(path.name + ".lock")):
            raw = _native._read_private(path)
            verdict = raw.decode(errors="replace").strip() if raw else ""
            kept = bool(verdict)
            if not kept:
                verdict, kept = _run_probe(library)
                if kept:
                    _write_verdict(path, verdict)
    except (OSError, RuntimeError) as exc:  # an unsafe or unreadable file, no lock
        verdict, kept = f"its verdict file cannot be used ({exc})", False
    if verdict == "ok":
        return True
    hint = (f"delete {path} to check again" if kept else "the next process checks again")
    logger.warning("launch kernels: the C++ library %s cannot be shown to raise its errors in "
                   "this process (checked in a child process: %s); eager calls and static units "
                   "use the general ops, which are slower (%s, or set %s=0 to turn native "
                   "kernels off)", library, verdict, hint, _native.ENV_DISABLE)
    return False


def _run_probe(library: str) -> tuple[str, bool]:
    """(verdict, whether it is about the library): ``("ok", True)`` when the child passed."""
    import torchair

    root = os.path.dirname(os.path.dirname(os.path.abspath(torchair.__file__)))
    env = dict(os.environ, **{PROBE_ENV: library})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        child = subprocess.Popen([sys.executable, "-c", _PROBE_CODE], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)  # its own group: killed as a whole
    except OSError as exc:
        return f"the child did not start ({exc})", False
    try:
        out, err = child.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.communicate()
        return f"no answer in {PROBE_TIMEOUT_S:.0f} s", False
    rc = child.returncode
    if rc == 0 and out.strip().endswith("ok"):
        return "ok", True
    if rc < 0:
        try:
            sig = signal.Signals(-rc)
        except ValueError:
            return f"the child was killed by signal {-rc}", False
        return f"the child was killed by {sig.name}", sig in _CRASH_SIGNALS
    tail = " | ".join((err or out).strip().splitlines()[-3:])[-400:]
    return f"the child exited with {rc}: {tail}", rc == _PROBE_FAILED


def _write_verdict(path: pathlib.Path, verdict: str) -> None:
    try:
        _native.write_private(path, (verdict + "\n").encode())
    except OSError as exc:  # a read-only cache: the check runs again in the next process
        logger.warning("launch kernels: could not keep the error check's verdict in %s (%s); "
                       "each process checks again", path, exc)


def _probe() -> None:
    """The child's side of :func:`errors_reach_python`: prints "ok" when both error paths
    work; exits with ``_PROBE_FAILED`` when one misbehaves (or dies, when one crashes)."""
    if not _load():
        raise SystemExit("the launch kernels did not load in the child")
    if os.path.abspath(_lib._name) != os.path.abspath(os.environ[PROBE_ENV]):
        print(f"the child loaded {_lib._name}, not {os.environ[PROBE_ENV]}", file=sys.stderr)
        raise SystemExit(_PROBE_OTHER_LIBRARY)
    q, kv = torch.zeros(1, 8, 1, 64), torch.zeros(1, 2, 16, 64)

    def call(defer: bool) -> torch.Tensor:
        return ifa_decode()(q, kv, kv, torch.tensor([-1]), None, None, 8, 2, LAYOUTS["BNSD"], 0,
                            0.125, defer)

    def failed(why: str) -> None:
        print(why, file=sys.stderr)
        raise SystemExit(_PROBE_FAILED)

    try:
        call(False)
    except ValueError as exc:
        if "actual_seq_lengths" not in str(exc):
            failed(f"unexpected error text: {exc}")
    except Exception as exc:  # noqa: BLE001 - the wrong type is the finding
        failed(f"a negative length raised {type(exc).__name__}, not ValueError: {exc}")
    else:
        failed("a negative length raised nothing")
    call(True)
    if _take() is None:
        failed("a deferred error was not kept")
    print("ok")


probe = _probe  # the check's child, public: bench/gpu_launch_probe.sh runs it under a debugger


def _define_general() -> None:
    """``torchair_native::ifa_general[_tensor]``: the npu ops' Python implementation under
    another name, for the C++ entry to call when it does not take a call (the npu ops' own CPU
    kernel is then the C++ entry)."""
    from torchair.ops.attention import incre_flash_attention as ifa

    global _general_lib
    _general_lib = torch.library.Library("torchair_native", "FRAGMENT")
    for op, name in zip(_IFA_OPS, ("ifa_general", "ifa_general_tensor")):
        schema = (ifa._SCHEMA if op == _IFA_OPS[0] else ifa._TWIN_SCHEMA).replace(
            f"{op}(", f"{name}(", 1)
        _general_lib.define(schema)
        _general_lib.impl(name, ifa._eager, "CompositeExplicitAutograd")
        torch.library.register_fake(f"torchair_native::{name}", ifa._fake, lib=_general_lib)


_general_lib: Any = None


def set_eager(on: bool) -> None:
    """Turn the C++ eager entry of ``npu_incre_flash_attention`` on or off (when loaded)."""
    if _lib is not None:
        _lib.torchair_launch_set_eager(int(on))


def clear() -> None:
    """Forget the signatures the C++ eager entry has seen validated (when loaded)."""
    if _lib is not None:
        _lib.torchair_launch_clear()


def loaded() -> bool:
    """Whether the launch kernels are registered in this process (never builds them)."""
    return _take_error is not None


def _take() -> str | None:
    """The error a deferred launch-kernel call of this thread kept, cleared (None: none)."""
    if _take_error is None:
        return None
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ctypes.create_string_buffer(8192)
    if not _take_error(buf, len(buf)):
        return None
    return buf.value.decode(errors="replace")


def checked(engine: Any, as_fia: bool = False, in_order: bool = False) -> Any:
    """``engine`` (a static unit's ``fn(args) -> outputs``) raising, after each run, the
    ValueError a launch kernel deferred during it (static units call them with
    ``defer_errors=True``: an exception thrown in C++ would cross Inductor's C++ wrapper or an
    AOTInductor library as a RuntimeError, not as the ValueError eager raises). ``as_fia``: the
    unit's bound calls are ``npu_fused_infer_attention_score`` calls (:func:`fia_errors`): the
    error is named as that op names it. ``in_order``: the engine runs the ops in the program's
    order (the FX engine; see :func:`eager_error`)."""
    def run(args: list) -> Any:
        if _pending.value:
            _take()  # kept by a call outside any unit run (defer_errors by hand): not ours
        try:
            outputs = engine(args)
        except BaseException as exc:
            error = eager_error(exc, as_fia, in_order)
            if error is not None:
                raise error from None
            raise
        if _pending.value:
            raise_pending(as_fia)
        return outputs

    return run


# what a Python op's exception becomes when Inductor's C++ wrapper or an AOTInductor library
# called the op: a RuntimeError "<type>: <text>" (pybind11 may append "\n\nAt:\n<frames>")
_WRAPPED = re.compile(r"(ValueError|TypeError|NotImplementedError): (.*?)(?:\n\nAt:\n.*)?",
                      re.DOTALL)
_WRAPPED_TYPES = {"ValueError": ValueError, "TypeError": TypeError,
                  "NotImplementedError": NotImplementedError}


def eager_error(exc: BaseException, as_fia: bool = False,
                in_order: bool = False) -> BaseException | None:
    """The exception eager raises where a unit's run raised ``exc`` (None: ``exc`` itself);
    whatever a launch kernel kept during the run is cleared either way (a failed run leaves
    nothing for the next).

    * A ValueError a launch kernel deferred earlier in the run, when the engine runs the ops in
      program order (``in_order``, the FX engine): eager stops at that earlier call and never
      reaches the one that raised. Inductor may run a bound call before an earlier op of the
      program, so there the run's own exception stays.
    * A Python op's ValueError / TypeError / NotImplementedError that Inductor's C++ wrapper or
      an AOTInductor library turned into a RuntimeError: the original type and text.
    * An interrupt (not an ``Exception``) stays what it is."""
    kept = _take()
    if not isinstance(exc, Exception):
        return None
    if kept is not None and in_order:
        return ValueError(_worded(kept, as_fia))
    if type(exc) is RuntimeError:
        match = _WRAPPED.fullmatch(str(exc))
        if match:
            return _WRAPPED_TYPES[match.group(1)](match.group(2))
    return None


def pending() -> Any:
    """The library's count of threads holding a deferred error (a ``ctypes.c_int``: read
    ``.value`` after a run; :func:`raise_pending` when it is not zero). None when not loaded."""
    return _pending


def raise_pending(as_fia: bool = False) -> None:
    """Raise the ValueError a launch kernel deferred in this thread, if any (see
    :func:`checked`)."""
    error = _take()
    if error is not None:
        raise ValueError(_worded(error, as_fia))


def _worded(error: str, as_fia: bool) -> str:
    """A deferred error's text as eager words it: in a unit whose bound decode calls are FIA
    calls, the IFA-worded ones are renamed (fia_prompt's texts are FIA's own already)."""
    from torchair.ops.attention import ifa_checks as _ifa_checks

    if as_fia and error.startswith(_ifa_checks.OP + ":"):
        from torchair.ops.attention import fia_checks as _fia_checks

        return _fia_checks.as_fia_message(error, kv_lengths=True)
    return error


def _ifa_decode_fake(query, key, value, actual_seq_lengths, ends, block_table, num_heads,
                     num_key_value_heads, layout, block_size, scale_value, defer_errors=False,
                     host_lengths=False, abi=0):
    return query.new_empty(query.shape)  # contiguous, as the kernel's (and its fallback's) result


def _fia_prompt_fake(query, key, value, actual_seq_lengths, actual_seq_lengths_kv, block_table,
                     num_heads, num_key_value_heads, layout, block_size, scale, sparse_mode,
                     pre_tokens, next_tokens, host_lengths=0, wording=0, defer_errors=False,
                     atten_mask=None, abi=0):
    return query.new_empty(query.shape)  # contiguous, as the kernel's result


def ifa_decode() -> Any:
    """The operator (``available()`` must be True)."""
    return torch.ops.torchair_native.ifa_decode.default


def fia_prompt() -> Any:
    """``torchair_native::fia_prompt`` (``available()`` must be True): an
    ``npu_fused_infer_attention_score`` call with any number of query tokens, as
    :func:`bind_static_unit` binds it (launch_ops.cpp: each query token a row of the decode
    kernel with its own window of KV positions)."""
    return torch.ops.torchair_native.fia_prompt.default


def _abi(op: Any) -> int:
    """The number naming ``op``'s schema that a unit passes as its ``abi`` argument
    (:func:`torchair.ops.toolchain.native.abi_number`)."""
    return _native.abi_number(op)


def _meta(val: Any) -> Any:
    """A meta tensor like the traced value ``val`` (shapes only: the general op's value checks
    skip meta tensors)."""
    if not isinstance(val, torch.Tensor):
        return val
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                               device="meta")


def _takes(node: fx.Node) -> bool:
    """The call's arguments, as traced, pass the general op's validation and are a decode call
    on CPU that the launch kernel serves."""
    if len(node.args) != 3 or any(k not in _TAKEN and v is not None
                                  for k, v in node.kwargs.items()):
        return False
    return _decode_takes(node.args, node.kwargs)


def _decode_takes(args: tuple, node_kwargs: dict) -> bool:
    """:func:`_takes` of IFA arguments (query, key, value and the keyword arguments, as FX
    nodes or constants)."""
    from torchair.ops.attention import ifa_checks as _ifa_checks
    from torchair.ops.attention import ifa_compute as _compute

    if any(isinstance(a, fx.Node) and not isinstance(a.meta.get("val"), torch.Tensor)
           for a in [*args, node_kwargs.get("block_table")]):
        return False  # no traced tensor to check
    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    kwargs = {k: (v.meta.get("val") if isinstance(v, fx.Node) else v)
              for k, v in node_kwargs.items()}
    lengths = node_kwargs.get("actual_seq_lengths")
    if isinstance(lengths, fx.Node) and not isinstance(lengths.meta.get("val"), torch.Tensor):
        # a slice of the sunk scalar buffer (no traced value): int64, as many entries as the
        # traced list had (a count the op refuses stays the general op's, which raises)
        kwargs["actual_seq_lengths"] = _sunk_lengths(lengths)
        if kwargs["actual_seq_lengths"] is None:
            return False
    for t in [*vals, kwargs.get("actual_seq_lengths"), kwargs.get("block_table")]:
        if t is not None and (not isinstance(t, torch.Tensor)
                              or t.device.type not in ("cpu", "meta")):
            return False
    query = vals[0]
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    try:
        plan = _ifa_checks.validate(*(_meta(v) for v in vals),
                                    **{k: _meta(v) for k, v in kwargs.items()
                                       if k != "inner_precise"})
    except (ValueError, TypeError, RuntimeError):
        return False  # the general op raises its error at run time
    if plan.kv_int8 or not _compute.decode_eligible(plan, None):
        return False
    return _kernel_takes(plan, *vals, kwargs.get("block_table"))


def _defaults_but(kwargs: dict, taken: Any, defaults: dict) -> bool:
    """Every keyword argument not in ``taken`` has its default."""
    return all(name in taken or value == defaults.get(name, object())
               for name, value in kwargs.items())


def _only_output_used(node: fx.Node) -> bool:
    """The call's users only take its first output (FIA's softmax_lse is unused)."""
    return (all(u.op == "call_function" and u.target is operator.getitem for u in node.users)
            and not any(u.args[1] != 0 and u.users for u in node.users))


# FIA keyword arguments -> IFA's, for a decode call the launch kernel serves; every other FIA
# argument must have its default (no masks, quantization, prefixes, rope or lse output)
_FIA_AS_IFA = {"actual_seq_lengths_kv": "actual_seq_lengths", "block_table": "block_table",
               "num_heads": "num_heads", "scale": "scale_value", "input_layout": "input_layout",
               "num_key_value_heads": "num_key_value_heads", "block_size": "block_size",
               "inner_precise": "inner_precise"}


def _fia_as_ifa(node: fx.Node) -> dict | None:
    """IFA keyword arguments equivalent to an ``npu_fused_infer_attention_score_tensor`` call
    (one query token, the other arguments at their defaults, its lse output unused and its own
    validation passing), or None."""
    from torchair.ops.attention import fused_infer_attention_score as _fia
    from torchair.ops.attention import fia_checks as _fia_checks

    if (len(node.args) != 3 or not _defaults_but(node.kwargs, _FIA_AS_IFA, _fia._DEFAULTS)
            or not _only_output_used(node)):
        return None
    query = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(query, torch.Tensor):
        return None
    kwargs = {_FIA_AS_IFA[k]: v for k, v in node.kwargs.items() if k in _FIA_AS_IFA}
    try:
        metas = {k: _meta(v.meta.get("val") if isinstance(v, fx.Node) else v)
                 for k, v in node.kwargs.items()}
        lengths = node.kwargs.get("actual_seq_lengths_kv")
        if _host_list(lengths):
            metas["actual_seq_lengths_kv"] = _sunk_lengths(lengths)
            if metas["actual_seq_lengths_kv"] is None:
                return None
        plan = _fia_checks.validate(_fia._args(*(_meta(a.meta.get("val")) for a in node.args),
                                               metas))
    except (ValueError, TypeError, RuntimeError, NotImplementedError, AttributeError):
        return None
    if plan.ifa.dims.q_len != 1:
        return None
    return kwargs


# FIA keyword arguments torchair_native::fia_prompt takes; every other one must have its default
_FIA_PROMPT = {"actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "num_heads", "scale",
               "input_layout", "num_key_value_heads", "block_size", "inner_precise",
               "sparse_mode", "pre_tokens", "next_tokens", "atten_mask"}


def _fia_v2_as_v1(node: fx.Node) -> dict | None:
    """The v1 keyword arguments of an ``npu_fused_infer_attention_score_v2_tensor`` call whose
    output is in the query's layout (not NSD) and whose v2-only arguments have their defaults,
    or None."""
    from torchair.ops.attention import fused_infer_attention_score_v2 as _v2

    kw = node.kwargs
    if not _defaults_but(kw, {*_v2._TO_V1, "input_layout"}, _v2._DEFAULTS):
        return None  # a v2-only argument in use (rope, int8 query, dtypes, ...)
    layout = kw.get("input_layout", "BSH")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        return None  # another output layout, NSD, TND/NTD
    return {_v2._TO_V1[k]: v for k, v in kw.items() if k in _v2._TO_V1} | {"input_layout": layout}


def _fia_prompt_args(node: fx.Node, kw: dict | None = None, wording: int = 0) -> tuple | None:
    """The ``torchair_native::fia_prompt`` arguments after (query, key, value) for an
    ``npu_fused_infer_attention_score_tensor`` call (or a v2 call: ``kw`` its v1 keyword
    arguments, ``wording`` 1) it computes exactly as the general op (launch_ops.cpp): no
    pse_shift, antiquant, output quantization, padding or prefixes; an atten_mask of sparse
    modes 0/1 the same for every head (a CPU tensor; modes 2-4 ignore theirs); the lse output
    unused; int64 CPU lengths; FIA's own validation passing for the unit's shapes; shapes the
    kernel takes. None otherwise (the call stays the general op's)."""
    from torchair.ops.attention import fia_checks as _fia_checks
    from torchair.ops.attention import fused_infer_attention_score as _fia

    kw = node.kwargs if kw is None else kw
    if (len(node.args) != 3 or not _defaults_but(kw, _FIA_PROMPT, _fia._DEFAULTS)
            or not _only_output_used(node)):
        return None
    for name in ("num_heads", "num_key_value_heads", "block_size", "sparse_mode", "pre_tokens",
                 "next_tokens", "input_layout", "scale"):
        if isinstance(kw.get(name), fx.Node):
            return None  # a symbolic option: not a fixed call
    mode = kw.get("sparse_mode", 0)
    if mode not in (0, 1, 2, 3, 4):
        return None
    mask = kw.get("atten_mask") if mode <= 1 else None
    if mask is not None:
        val = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if not (isinstance(val, torch.Tensor) and val.device.type == "cpu"
                and (val.dim() != 4 or val.shape[1] == 1)):
            return None  # a per-head mask (or no traced tensor): the general op's
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args]
    if not all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in vals):
        return None
    query = vals[0]
    metas, host = {}, 0
    for name, value in kw.items():
        val = value.meta.get("val") if isinstance(value, fx.Node) else value
        if name in ("actual_seq_lengths", "actual_seq_lengths_kv") and value is not None:
            if not isinstance(value, fx.Node):
                return None  # host lists: the twin always has tensors
            if _host_list(value):  # a slice of the sunk scalar buffer; the general op checks
                # host lists further
                val = _sunk_lengths(value)
                if val is None:
                    return None
                host |= 1 if name == "actual_seq_lengths" else 2
            elif not (isinstance(val, torch.Tensor) and val.dtype == torch.int64
                      and val.dim() == 1 and val.device.type == "cpu"):
                return None
        elif isinstance(value, fx.Node) and not isinstance(val, torch.Tensor):
            return None
        if name == "block_table" and val is not None and val.device.type != "cpu":
            return None
        metas[name] = _meta(val)
    try:
        plan = _fia_checks.validate(_fia._args(*(_meta(v) for v in vals), metas))
    except (ValueError, TypeError, RuntimeError, NotImplementedError, AttributeError):
        return None  # the general op raises its error at run time
    if (plan.k_quant is not None or plan.v_quant is not None or plan.ifa.kv_padding is not None
            or query.dtype not in (torch.float32, torch.bfloat16, torch.float16)
            or plan.ifa.dims.q_len == 0 or plan.ifa.dims.kv_len == 0):
        return None  # (empty sequences: the general op's own behaviour, errors included)
    if not all(-2**63 <= int(kw.get(n, 0)) < 2**63 for n in ("pre_tokens", "next_tokens")):
        return None  # not an int64 of the kernel's schema
    table = kw.get("block_table")
    table_val = table.meta.get("val") if isinstance(table, fx.Node) else None
    if table is not None and not isinstance(table_val, torch.Tensor):
        return None
    if not _kernel_takes(plan.ifa, *vals, table_val):
        return None
    dims = plan.ifa.dims
    return (kw.get("actual_seq_lengths"), kw.get("actual_seq_lengths_kv"), table,
            dims.num_heads, dims.num_kv_heads, LAYOUTS[plan.ifa.layout],
            kw.get("block_size", 0), float(kw.get("scale", 1.0)), int(mode),
            plan.pre_tokens, plan.next_tokens, host, wording, True, mask)


def _kernel_takes(plan: Any, query, key, value, table) -> bool:
    """The shapes launch_ops.cpp's ``canonical`` takes (so the C++ code never falls back to the
    general op inside a static unit, where the general op's errors would not be deferred)."""
    dims = plan.dims
    group = dims.num_heads // dims.num_kv_heads
    if (key.dtype != query.dtype or value.dtype != query.dtype
            or tuple(key.shape) != tuple(value.shape) or key.stride() != value.stride()
            or key.stride(-1) != 1 or dims.head_dim % 16 or dims.head_dim > _decode_native.MAX_D
            or group > _decode_native.MAX_G):
        return False
    if table is not None and (table.stride(1) != 1 or key.dim() == 4 and plan.layout != "BNSD"):
        return False
    return True


def bind_static_unit(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of a CPU static unit's graph with the decode attention calls that the launch
    kernel serves rewritten to it (module doc), and how many were rewritten; ``(gm, 0)``, ``gm``
    itself, when there are none or the kernels are not available. ``gm`` is never changed (the
    compile cache saves it with the general ops)."""
    twin = torch.ops.npu.npu_incre_flash_attention_tensor.default
    taken = [(n, n.kwargs) for n in gm.graph.nodes
             if n.op == "call_function" and n.target is twin and _takes(n)]
    fia, prompt = [], []
    fia_twin = torch.ops.npu.npu_fused_infer_attention_score_tensor.default
    as_ifa = fia_errors(gm)  # FIA calls only: a deferred error can be named after FIA (checked())
    for n in gm.graph.find_nodes(op="call_function", target=fia_twin):
        kwargs = _fia_as_ifa(n) if as_ifa else None
        if kwargs is not None and _kernel_args_ok(n, kwargs):
            fia.append((n, kwargs))
            continue
        args = _fia_prompt_args(n)  # worded as FIA itself: units with IFA calls too take them
        if args is not None:
            prompt.append((n, args))
    v2_twin = torch.ops.npu.npu_fused_infer_attention_score_v2_tensor.default
    for n in gm.graph.find_nodes(op="call_function", target=v2_twin):
        kwargs = _fia_v2_as_v1(n)
        args = _fia_prompt_args(n, kwargs, wording=1) if kwargs is not None else None
        if args is not None:
            prompt.append((n, args))
    if not (taken or fia or prompt) or not available():
        return gm, 0
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    calls = [(old, ifa_decode(), (_copied(kw.get("actual_seq_lengths"), copies), None,
                                  _copied(kw.get("block_table"), copies), kw.get("num_heads", 1),
                                  kw.get("num_key_value_heads", 0),
                                  LAYOUTS[kw.get("input_layout", "BSH")], kw.get("block_size", 0),
                                  float(kw.get("scale_value", 1.0)),
                                  True,  # defer_errors: see checked()
                                  _host_list(kw.get("actual_seq_lengths")), _abi(ifa_decode())))
             for old, kw in taken + fia]
    calls += [(old, fia_prompt(), (*(_copied(a, copies) for a in args), _abi(fia_prompt())))
              for old, args in prompt]
    for old, op, rest in calls:
        node = copies[old]
        with graph.inserting_before(node):
            new = graph.call_function(op, (*node.args, *rest))
        if old.target is twin:
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
        else:  # FIA returns (out, lse): its out is the kernel's; the unused lse goes
            new.meta = {k: v for k, v in node.meta.items() if k != "val"}
            val = node.meta.get("val")
            if isinstance(val, (tuple, list)):
                new.meta["val"] = val[0]
            for user in list(node.users):
                if user.args[1] == 0:
                    user.replace_all_uses_with(new)
                graph.erase_node(user)
        graph.erase_node(node)
    return fx.GraphModule(gm, graph), len(calls)


def _host_list(lengths: Any) -> bool:
    """Whether a length argument of a unit's call was a host list in the traced call: a slice of
    the unit's sunk scalar buffer (no traced value). The general op checks such lengths against
    a paged cache's block table (launch_ops.cpp: check_paged_lengths), so the kernel does too."""
    return isinstance(lengths, fx.Node) and not isinstance(lengths.meta.get("val"), torch.Tensor)


def _sunk_lengths(node: fx.Node) -> torch.Tensor | None:
    """A meta int64 tensor with as many entries as the host list a sunk length argument holds
    (the traced list's length is fixed for the unit), or None when the node is not a slice of
    the unit's sunk scalar buffer (:func:`torchair.plan.sink.sunk_slots`)."""
    slots = sunk_slots(node)
    if slots is None:
        return None
    return torch.empty(slots[1] - slots[0], dtype=torch.int64, device="meta")


def _copied(value: Any, copies: dict) -> Any:
    return copies.get(value, value) if isinstance(value, fx.Node) else value


def _kernel_args_ok(node: fx.Node, kwargs: dict) -> bool:
    """:func:`_decode_takes` of an FIA call's IFA equivalent."""
    return _decode_takes(node.args, kwargs)


def fia_errors(gm: fx.GraphModule) -> bool:
    """Whether a unit's deferred launch-kernel errors come from ``npu_fused_infer_attention_score``
    calls: it calls FIA's tensor twin and not IFA's (only then are FIA calls bound)."""
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    return (torch.ops.npu.npu_fused_infer_attention_score_tensor.default in targets
            and torch.ops.npu.npu_incre_flash_attention_tensor.default not in targets)
