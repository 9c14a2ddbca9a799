"""Ascend-only switches scripts set: ``torch.npu.config.allow_internal_format``,
``torch.npu.matmul.allow_hf32``, ``torch.npu.conv.allow_hf32``, ``torch.npu.set_option({...})``,
``torch.npu.set_compile_mode(jit_compile=...)``, ``set_mm_bmm_format_nd``.

They choose Ascend kernels and layouts, so off Ascend they change nothing. Values are accepted
and stored (reading one back gives what was set, or the Ascend default), and the first time each
is set the torchair logger says at INFO that it has no effect here.
"""
from __future__ import annotations

from typing import Any

from torchair.base.log import logger
from torchair.compat._errors import not_emulated

__all__ = ["Settings", "settings_api"]


class _Told:
    """Which switches were already reported (once per switch and emulation)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def once(self, what: str, value: Any) -> None:
        if what not in self.names:
            self.names.add(what)
            logger.info("%s = %r: stored; it has no effect off Ascend (torch_npu emulation)",
                        what, value)


class Settings:
    """An attribute bag for ``torch.npu.config`` / ``matmul`` / ``conv``: setting stores the value
    (reported once); reading a name never set nor defaulted raises ``NotEmulatedError``."""

    def __init__(self, path: str, told: _Told, **defaults: Any) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_told", told)
        self.__dict__.update(defaults)

    def __setattr__(self, name: str, value: Any) -> None:
        self._told.once(f"{self._path}.{name}", value)
        self.__dict__[name] = value

    def __getattr__(self, name: str) -> Any:  # only for names not stored
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise not_emulated(self._path, name)

    def __repr__(self) -> str:
        values = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return f"<{self._path} (emulated, no effect off Ascend) {values}>"


def settings_api() -> dict[str, Any]:
    """The switch names of ``torch.npu``, sharing one store and one once-per-switch report."""
    told = _Told()
    options: dict[str, str] = {}
    nd = {"enabled": True}  # torch_npu's default: mm/bmm in ND format

    def set_option(option: dict) -> None:
        """Store ACL options (``{"ACL_PRECISION_MODE": "allow_fp32_to_fp16", ...}``)."""
        if not isinstance(option, dict):
            raise TypeError(f"torch.npu.set_option: option must be a dict of ACL option names "
                            f"to values; got {type(option).__name__}")
        for name, value in option.items():
            told.once(f"torch.npu.set_option {name!r}", value)
            options[str(name)] = str(value)

    def set_compile_mode(jit_compile: bool = False) -> None:
        """Store the ACL jit_compile switch (operator compilation is Ascend's)."""
        told.once("torch.npu.set_compile_mode jit_compile", jit_compile)
        options["jitCompile"] = "enable" if jit_compile else "disable"

    def is_jit_compile_false() -> bool:
        return options.get("jitCompile", "disable") == "disable"

    def set_mm_bmm_format_nd(is_nd: bool = True) -> None:
        told.once("torch.npu.set_mm_bmm_format_nd is_nd", is_nd)
        nd["enabled"] = bool(is_nd)

    def get_mm_bmm_format_nd() -> bool:
        return nd["enabled"]

    return {
        "config": Settings("torch.npu.config", told, allow_internal_format=False),
        "matmul": Settings("torch.npu.matmul", told, allow_hf32=False),
        "conv": Settings("torch.npu.conv", told, allow_hf32=True),
        "set_option": set_option, "set_compile_mode": set_compile_mode,
        "is_jit_compile_false": is_jit_compile_false,
        "set_mm_bmm_format_nd": set_mm_bmm_format_nd,
        "get_mm_bmm_format_nd": get_mm_bmm_format_nd,
    }
