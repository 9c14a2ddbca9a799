"""The errors of a static unit's launch-kernel calls, raised as eager raises them.

Static units call the launch kernels (:mod:`torchair.ops.attention.cpu.launch_library`) with
``defer_errors=True``: an exception thrown in C++ would cross Inductor's C++ wrapper or an
AOTInductor library as a RuntimeError, not as the ValueError eager raises. So a bad length or
block id is kept by the library (one per thread) and the call returns zeros; :func:`checked`
wraps a unit's engine to raise it after the run, worded as the op the program called words it
(an FIA call bound as an IFA one is named after FIA). :func:`eager_error` also turns a Python op's
error that Inductor's C++ wrapper wrapped in a RuntimeError back into its own type and text.
"""
from __future__ import annotations

import re
from typing import Any

from torchair.ops.attention import fia_checks as _fia_checks, ifa_checks as _ifa_checks
from torchair.ops.attention.cpu import launch_library as _library

__all__ = ["checked", "eager_error", "raise_pending"]

# what a Python op's exception becomes when Inductor's C++ wrapper or an AOTInductor library
# called the op: a RuntimeError "<type>: <text>" (pybind11 may append "\n\nAt:\n<frames>")
_WRAPPED = re.compile(r"(ValueError|TypeError|NotImplementedError): (.*?)(?:\n\nAt:\n.*)?",
                      re.DOTALL)
_WRAPPED_TYPES = {"ValueError": ValueError, "TypeError": TypeError,
                  "NotImplementedError": NotImplementedError}


def checked(engine: Any, as_fia: bool = False, in_order: bool = False) -> Any:
    """``engine`` (a static unit's ``fn(args) -> outputs``) raising, after each run, the
    ValueError a launch kernel deferred during it (module doc). ``as_fia``: the unit's bound
    calls are ``npu_fused_infer_attention_score`` calls
    (:func:`torchair.runtime.binders.attention.fia_errors`): the error is named as that op names
    it. ``in_order``: the engine runs the ops in the program's order (the FX engine; see
    :func:`eager_error`). The library must be loaded."""
    pending = _library.pending()

    def run(args: list) -> Any:
        if pending.value:
            _library.take()  # kept by a call outside any unit run (defer_errors by hand): not ours
        try:
            outputs = engine(args)
        except BaseException as exc:
            error = eager_error(exc, as_fia, in_order)
            if error is not None:
                raise error from None
            raise
        if pending.value:
            raise_pending(as_fia)
        return outputs

    return run


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
    kept = _library.take()
    if not isinstance(exc, Exception):
        return None
    if kept is not None and in_order:
        return ValueError(_worded(kept, as_fia))
    if type(exc) is RuntimeError:
        match = _WRAPPED.fullmatch(str(exc))
        if match:
            return _WRAPPED_TYPES[match.group(1)](match.group(2))
    return None


def raise_pending(as_fia: bool = False) -> None:
    """Raise the ValueError a launch kernel deferred in this thread, if any (see
    :func:`checked`)."""
    error = _library.take()
    if error is not None:
        raise ValueError(_worded(error, as_fia))


def _worded(error: str, as_fia: bool) -> str:
    """A deferred error's text as eager words it: in a unit whose bound decode calls are FIA
    calls, the IFA-worded ones are renamed (fia_prompt's texts are FIA's own already)."""
    if as_fia and error.startswith(_ifa_checks.OP + ":"):
        return _fia_checks.as_fia_message(error, kv_lengths=True)
    return error
