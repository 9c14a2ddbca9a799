"""``torchair.scope.super_kernel``: mark the ops of a region for fusion into one SuperKernel."""
from __future__ import annotations

from types import TracebackType

from torchair.scope._markers import BEGIN, END
from torchair.scope._options import check_options

_MAX_SCOPE_LEN = 255


def _check_scope(scope: str | None) -> str | None:
    """The scope's name; ``None`` for ``None`` and ``""`` (TorchAir treats both as no fusion)."""
    if scope is None or scope == "":
        return None
    if not isinstance(scope, str):
        raise TypeError(f"super_kernel scope must be a str (the region's name) or None (no "
                        f"fusion), got {type(scope).__name__} {scope!r}")
    if len(scope) > _MAX_SCOPE_LEN:
        raise ValueError(f"super_kernel scope {scope[:20]!r}... has {len(scope)} characters; "
                         f"use at most {_MAX_SCOPE_LEN}")
    return scope


class super_kernel:  # lower case: TorchAir's public name
    """Context manager: the ops run inside form the SuperKernel region ``scope``.

    ``with torchair.scope.super_kernel("sk1", "stream-fusion=1"): ...`` inside a function compiled
    with the torchair backend. The same ``scope`` name used twice is the same region; scopes nest
    (the innermost wins) and ``scope=None`` (or ``""``) keeps a region out of an enclosing
    scope. ``options`` is ``"opt1=v1:opt2=v2"`` with TorchAir's SuperKernel options (see
    :mod:`torchair.scope._options`). As in TorchAir any string is accepted and kept as given
    (graph dumps and the report show it); the parts not understood here are ignored, with a
    warning when the graph is compiled. Outside ``torch.compile`` the scope does nothing.

    The region must be traced as one graph. Dynamo cannot resume inside a user context manager,
    so a graph break inside the ``with`` block makes it run the whole function eagerly (with
    ``fullgraph=True`` it is an error; ``TORCH_LOGS=graph_breaks`` shows where). Markers left
    unpaired in a graph (e.g. by a custom pass) are a ``ValueError`` from the backend.
    """

    def __init__(self, scope: str | None, options: str = "") -> None:
        self.scope = _check_scope(scope)
        check_options(options)  # a str; what it says is checked (and warned about) at compile
        self.options = options

    def __enter__(self) -> None:
        BEGIN(self.scope, self.options)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        END(self.scope)
        return False
