"""``torchair.scope.super_kernel``: mark the ops of a region for fusion into one SuperKernel."""
from __future__ import annotations

from types import TracebackType

from torchair.scope._markers import BEGIN, END
from torchair.scope._options import normalize_options

_MAX_SCOPE_LEN = 255


def _check_scope(scope: str | None) -> None:
    if scope is None:
        return
    if not isinstance(scope, str):
        raise TypeError(f"super_kernel scope must be a str (the region's name) or None (no "
                        f"fusion), got {type(scope).__name__} {scope!r}")
    if not scope or len(scope) > _MAX_SCOPE_LEN:
        raise ValueError(f"super_kernel scope {scope!r} must have 1 to {_MAX_SCOPE_LEN} "
                         f"characters; pass None to keep a region out of fusion")


class super_kernel:  # lower case: TorchAir's public name
    """Context manager: the ops run inside form the SuperKernel region ``scope``.

    ``with torchair.scope.super_kernel("sk1", "stream-fusion=1"): ...`` inside a function compiled
    with the torchair backend. The same ``scope`` name used twice is the same region; scopes nest
    (the innermost wins) and ``scope=None`` keeps a region out of an enclosing scope.
    ``options`` is ``"opt1=v1:opt2=v2"`` with TorchAir's SuperKernel options (see
    :mod:`torchair.scope._options`); it is validated here, so a typo fails in eager mode too.
    Outside ``torch.compile`` the scope does nothing.

    The region must be traced as one graph. Dynamo cannot resume inside a user context manager,
    so a graph break inside the ``with`` block makes it run the whole function eagerly (with
    ``fullgraph=True`` it is an error; ``TORCH_LOGS=graph_breaks`` shows where). Markers left
    unpaired in a graph (e.g. by a custom pass) are a ``ValueError`` from the backend.
    """

    def __init__(self, scope: str | None, options: str = "") -> None:
        _check_scope(scope)
        self.scope = scope
        self.options = normalize_options(options)

    def __enter__(self) -> None:
        BEGIN(self.scope, self.options)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        END(self.scope)
        return False
