"""Native CPU kernels: small C files in ``csrc/`` built on first use and called through ctypes.

Some CPU kernels are bound by arithmetic the BLAS calls of a plain PyTorch implementation do
badly (decode attention's thin ``[G, D] x [D, C]`` products), so they have a C version with
register tiles. ``load(name)`` returns the ``ctypes.CDLL`` of ``csrc/<name>.c``, or ``None``
when it cannot be had; callers then use their PyTorch path, so a machine without a C compiler
loses speed, never results.

Build: ``$CC`` (default ``cc``) with ``-O3 -march=native -fopenmp`` (in a PyTorch process the
library uses PyTorch's own OpenMP runtime and threads: the dynamic linker loads ``libgomp`` once),
into
``$TORCHAIR_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/torchair/kernels``, else
``~/.cache/torchair/kernels``) under a name hashed from the source, the flags, the compiler's
version and this CPU's model and flags, so an edited kernel or another machine never loads a
stale library. The directory must belong to the current user and be writable by nobody else
(the checks of the ``cache_compile`` store); the library is compiled to a temporary name and
renamed into place, so concurrent first uses are safe. A failed build is logged once as a
warning with the compiler's message. ``TORCHAIR_NATIVE_KERNELS=0`` turns native kernels off.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import secrets
import stat
import subprocess
import threading
import time

from torchair.core.utils import logger

__all__ = ["ENV_DISABLE", "ENV_CACHE", "FLAGS", "cache_dir", "enabled", "load"]

ENV_DISABLE = "TORCHAIR_NATIVE_KERNELS"
ENV_CACHE = "TORCHAIR_KERNEL_CACHE"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-fPIC",
         "-shared")
_SRC_DIR = pathlib.Path(__file__).resolve().parent / "csrc"
_lock = threading.Lock()


def enabled() -> bool:
    """False when ``TORCHAIR_NATIVE_KERNELS`` is ``0`` / ``false`` / ``off``."""
    return os.environ.get(ENV_DISABLE, "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> pathlib.Path:
    """Where built libraries are kept (see the module doc)."""
    if os.environ.get(ENV_CACHE):
        return pathlib.Path(os.path.abspath(os.environ[ENV_CACHE]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(os.path.abspath(base)) / "torchair" / "kernels"


def load(name: str) -> ctypes.CDLL | None:
    """The library built from ``csrc/<name>.c``, or None (disabled, no compiler, build failed)."""
    if not enabled():
        return None
    with _lock:
        return _load(name, _compiler(), cache_dir())


@functools.lru_cache(maxsize=None)
def _load(name: str, compiler: str, root: pathlib.Path) -> ctypes.CDLL | None:
    source = _SRC_DIR / f"{name}.c"
    try:
        text = source.read_bytes()
    except OSError as exc:
        raise ValueError(f"no native kernel source {os.fspath(source)!r}: {exc}") from None
    version = _compiler_version(compiler)
    if version is None:
        logger.info("native CPU kernel %s: no C compiler %r found; using the PyTorch kernel "
                    "(set CC to a C compiler for the faster one)", name, compiler)
        return None
    key = hashlib.sha256(b"\0".join([text, " ".join(FLAGS).encode(), version.encode(),
                                     _cpu_signature().encode()])).hexdigest()[:20]
    try:
        from torchair.inference._cache_store import ensure_dir
        directory = ensure_dir(root)
        path = directory / f"{name}-{key}.so"
        if not os.path.lexists(path):
            _build(name, compiler, source, directory, path)
        _check_file(path)
        return ctypes.CDLL(os.fspath(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native CPU kernel %s could not be built or loaded (%s); using the PyTorch "
                       "kernel, which is slower (set %s=0 to silence this)", name, exc,
                       ENV_DISABLE)
        return None


def _compiler() -> str:
    return os.environ.get("CC") or "cc"


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler: str) -> str | None:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else None


@functools.lru_cache(maxsize=None)
def _cpu_signature() -> str:
    """CPU model and feature flags (what ``-march=native`` compiles for)."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                if len(parts) >= 4:
                    break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def _build(name: str, compiler: str, source: pathlib.Path, directory: pathlib.Path,
           path: pathlib.Path) -> None:
    tmp = directory / f".{name}-{secrets.token_hex(6)}.so.tmp"
    cmd = [compiler, *FLAGS, os.fspath(source), "-o", os.fspath(tmp)]
    logger.info("building native CPU kernel %s (first use on this machine): %s", name,
                " ".join(cmd))
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)  # atomic: a concurrent build of the same key leaves one good file
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)


def _check_file(path: pathlib.Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{os.fspath(path)!r} is not a regular file of the current user "
                           f"writable only by them; refusing to load it (remove it)")
