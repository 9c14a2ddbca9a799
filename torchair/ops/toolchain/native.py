"""Native CPU kernels: small C files in ``csrc/`` built on first use and called through ctypes.

Some CPU kernels are bound by arithmetic the BLAS calls of a plain PyTorch implementation do
badly (decode attention's thin ``[G, D] x [D, C]`` products), so they have a C version with
register tiles. ``load(name, symbols=(...))`` returns the ``ctypes.CDLL`` of ``csrc/<name>.c``
once every required symbol is found in it, or ``None`` when it cannot be had; callers then use
their PyTorch path, so a machine without a C compiler loses speed, never results.

Build: ``$CC`` (default ``cc``) with ``-O3 -march=native -fopenmp`` (in a PyTorch process the
library uses PyTorch's own OpenMP runtime and threads: the dynamic linker loads ``libgomp`` once),
into ``$TORCHAIR_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/torchair/kernels``, else
``~/.cache/torchair/kernels``). A *stem* ``<name>-<key>`` is hashed from the source, the flags,
the compiler's version and this CPU's model and flags, so an edited kernel or another machine
never loads a stale library. The directory must belong to the current user and be writable by
nobody else (the checks of ``torchair.base.files``, which the ``cache_compile`` store uses too);
so must every file read from it.

Files per stem, all mode 0600:

- ``<stem>-<sha16>.so``: the library, named after the first 16 hex digits of its own sha256.
  The compiler writes ``.tmp-<stem>-*.so``, which is ``fsync``-ed, renamed into place, and the
  directory ``fsync``-ed: a crash never leaves a half-written library under its final name.
- ``<stem>.json``: the record (format, library file name, size, sha256), written the same way
  (temp file, ``fsync``, rename, directory ``fsync``) and only after the library is in place.
- ``<stem>.lock``: an ``flock`` held while checking, building and loading, so concurrent first
  uses build once.

Before ``dlopen`` the library is checked against its record: ``dlopen`` of a truncated library
can kill the process with SIGBUS, an empty or overwritten one fails in odd ways. A missing or
invalid record, a missing library, or a size or sha256 mismatch is logged as a WARNING naming the
file and the reason; the library and record are removed and rebuilt. A required symbol missing
after loading: WARNING naming it, one rebuild, and ``None`` (with a WARNING) when it is still
missing. A rebuilt library with other content gets another file name, because ``dlopen`` hands
back the handle it already has for a path it loaded before in this process (same name means
same bytes, so that handle is then the right one). Symlinks, non-regular files, files of
another user or writable by others are refused, not rebuilt: the user must look. Temp files
older than ``$TORCHAIR_CACHE_LEFTOVER_SECONDS`` (an hour) left by crashed builds are swept (see
``torchair.base.leftovers.sweep_leftovers``). A failed build is logged once as a warning
with the compiler's message. ``TORCHAIR_NATIVE_KERNELS=0`` turns native kernels off.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import json
import os
import pathlib
import platform
import re
import secrets
import stat
import subprocess
import sysconfig
import threading
import time
from typing import Iterable, Iterator

from torchair.base.files import FILE_MODE, ensure_dir, fsync_dir, read_all, write_file_atomic as write_private
from torchair.base.leftovers import sweep_leftovers
from torchair.base.log import env_switch, logger

try:
    import fcntl
except ImportError:  # not POSIX: builds are still atomic, only not deduplicated
    fcntl = None

__all__ = ["CXX_FLAGS", "ENV_DISABLE", "ENV_CACHE", "FLAGS", "abi_number", "cache_dir",
           "cpu_signature", "enabled", "load", "locked", "read_private", "write_private"]

ENV_DISABLE = "TORCHAIR_NATIVE_KERNELS"
ENV_CACHE = "TORCHAIR_KERNEL_CACHE"
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-fPIC",
         "-shared")
# C++ sources: PyTorch operators (``TORCH_LIBRARY``), linked against this process's torch;
# -fopenmp makes their OpenMP loops (``#pragma omp``, ``at::parallel_for``) parallel: without it
# the pragmas are ignored and the loops run on one thread
CXX_FLAGS = ("-O3", "-march=native", "-std=c++20", "-w", "-fopenmp", "-fPIC", "-shared")
_SRC_DIR = pathlib.Path(__file__).resolve().parent / "csrc"
# what marks a C or C++ source as a Python extension module (built with this Python's headers,
# loaded with importlib after ``load``; see torchair.runtime.unit_call)
_PYTHON_EXTENSION = b"#include <Python.h>"
_RECORD_FORMAT = "torchair.native_kernel"
_RECORD_VERSION = 1
_lock = threading.Lock()


class _Damaged(Exception):
    """The cached library or its record is truncated, overwritten or missing: rebuild it."""

    def __init__(self, path: pathlib.Path, reason: str):
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path, self.reason = path, reason


def abi_number(op: object) -> int:
    """A nonzero number naming the schema of ``op`` (an ``OpOverload`` of a library built here),
    which static units pass as its last argument, ``abi`` (the kernels ignore it). A default
    argument drops out of the graph Inductor traces, so a new argument (with its default) would
    leave the graph, and Inductor's cache key, as they were: the cache would hand back code
    compiled for the old argument count, which the dispatcher then reads past (a crash). With the
    schema's number in the graph, another schema is another key."""
    import zlib

    return zlib.crc32(str(op._schema).encode()) % (2**31 - 1) + 1


def enabled() -> bool:
    """False when ``TORCHAIR_NATIVE_KERNELS`` is ``0`` / ``false`` / ``off``."""
    return env_switch(ENV_DISABLE)


def cache_dir() -> pathlib.Path:
    """Where built libraries are kept (see the module doc)."""
    if os.environ.get(ENV_CACHE):
        return pathlib.Path(os.path.abspath(os.environ[ENV_CACHE]))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(os.path.abspath(base)) / "torchair" / "kernels"


def load(name: str, *, symbols: Iterable[str] = ()) -> ctypes.CDLL | None:
    """The library built from ``csrc/<name>.c``, or None (disabled, no compiler, build failed,
    a symbol of ``symbols`` missing even after a rebuild). Pass every symbol the caller looks up,
    so a library lacking one is rebuilt or refused here rather than failing at the call."""
    symbols = _check_symbols(symbols)
    if not enabled():
        return None
    with _lock:
        return _load(name, _compiler(_source(_SRC_DIR, name)), cache_dir(), symbols, _SRC_DIR)


def _check_symbols(symbols: Iterable[str]) -> tuple[str, ...]:
    if isinstance(symbols, str):
        raise TypeError(f"load: symbols={symbols!r} is a string; pass a tuple of symbol names, "
                        f"e.g. ({symbols!r},)")
    symbols = tuple(symbols)
    if not all(isinstance(sym, str) and sym for sym in symbols):
        raise TypeError(f"load: symbols={symbols!r}: expected non-empty symbol names (str)")
    return symbols


@functools.lru_cache(maxsize=None)
def _load(name: str, compiler: str, root: pathlib.Path, symbols: tuple[str, ...] = (),
          src_dir: pathlib.Path = _SRC_DIR) -> ctypes.CDLL | None:
    """``load`` once per process and argument set: try-load, lock, check, build, load (see the
    module doc). Raises ValueError when the source is missing; returns None for everything
    else that goes wrong (OSError, RuntimeError, a failed compiler), with a warning."""
    source = _source(src_dir, name)
    try:
        text = source.read_bytes()
    except OSError as exc:
        raise ValueError(f"no native kernel source {os.fspath(source)!r}: {exc}") from None
    version = _compiler_version(compiler)
    if version is None:
        logger.info("native CPU kernel %s: no C compiler %r found; using the PyTorch kernel "
                    "(set CC to a C compiler for the faster one)", name, compiler)
        return None
    key = hashlib.sha256(b"\0".join([text, " ".join(_command_flags(source)).encode(),
                                     version.encode(), cpu_signature().encode()])).hexdigest()[:20]
    try:
        directory = ensure_dir(root)
        stem = f"{name}-{key}"
        with locked(directory / f"{stem}.lock"):
            _sweep(directory)
            return _load_checked(name, compiler, source, directory, stem, symbols)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native CPU kernel %s could not be built or loaded (%s); using the PyTorch "
                       "kernel, which is slower (set %s=0 to silence this)", name, exc,
                       ENV_DISABLE)
        return None


def _load_checked(name: str, compiler: str, source: pathlib.Path, directory: pathlib.Path,
                  stem: str, symbols: tuple[str, ...]) -> ctypes.CDLL | None:
    """The verified (else rebuilt) library, with every symbol of ``symbols`` (else rebuilt once,
    else None)."""
    lib, path = _open_library(name, compiler, source, directory, stem)
    missing = _missing_symbols(lib, symbols)
    if not missing:
        return lib
    logger.warning("native CPU kernel %s: library %s lacks the symbol(s) %s; removing it and "
                   "rebuilding once", name, path, ", ".join(missing))
    path = _build(name, compiler, source, directory, stem)
    lib = ctypes.CDLL(os.fspath(path))
    missing = _missing_symbols(lib, symbols)
    if missing:
        logger.warning("native CPU kernel %s: the rebuilt library %s still lacks the symbol(s) "
                       "%s (are they defined, and not static, in %s?); using the PyTorch kernel",
                       name, path, ", ".join(missing), source)
        return None
    return lib


def _open_library(name: str, compiler: str, source: pathlib.Path, directory: pathlib.Path,
                  stem: str) -> tuple[ctypes.CDLL, pathlib.Path]:
    """``dlopen`` the cached library once it matches its record; a damaged one (see the module
    doc) is logged, removed and rebuilt, and so is an absent one."""
    try:
        path = _cached_library(directory, stem)
    except _Damaged as exc:
        logger.warning("native CPU kernel %s: cached file %s is damaged (%s); removing the "
                       "library and its record and rebuilding", name, exc.path, exc.reason)
        path = None
    if path is None:
        path = _build(name, compiler, source, directory, stem)
    return ctypes.CDLL(os.fspath(path)), path


def _missing_symbols(lib: ctypes.CDLL, symbols: tuple[str, ...]) -> list[str]:
    missing = []
    for sym in symbols:
        try:
            lib[sym]  # a dlsym lookup; AttributeError when absent
        except AttributeError:
            missing.append(sym)
    return missing


def _source(src_dir: pathlib.Path, name: str) -> pathlib.Path:
    """``<name>.c``, else ``<name>.cpp`` (a C++ library of PyTorch operators), in ``src_dir``."""
    source = src_dir / f"{name}.c"
    cpp = src_dir / f"{name}.cpp"
    return cpp if not source.exists() and cpp.exists() else source


def _compiler(source: pathlib.Path | None = None) -> str:
    if source is not None and source.suffix == ".cpp":
        return os.environ.get("CXX") or "c++"
    return os.environ.get("CC") or "cc"


def _command_flags(source: pathlib.Path) -> tuple[str, ...]:
    """The compiler flags of ``source``: :data:`FLAGS` for C (and this Python's headers for a C
    extension module); for C++ (operators registered with PyTorch's dispatcher) :data:`CXX_FLAGS` plus this torch's headers, ABI and libraries
    (torch's version and install path are part of the cache key through them)."""
    if source.suffix != ".cpp":  # a C extension module: this Python's headers (no torch)
        return (FLAGS + (f"-I{sysconfig.get_paths()['include']}",)
                if _PYTHON_EXTENSION in source.read_bytes() else FLAGS)
    import torch

    root = pathlib.Path(torch.__file__).resolve().parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = (*CXX_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCHAIR_TORCH={torch.__version__}",
             f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
             f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}")
    if _PYTHON_EXTENSION in source.read_bytes():  # a Python extension module: this Python's headers
        flags += (f"-I{sysconfig.get_paths()['include']}",)
    return flags


def _libraries_flags(source: pathlib.Path) -> tuple[str, ...]:
    return ("-lc10", "-ltorch_cpu") if source.suffix == ".cpp" else ()


@functools.lru_cache(maxsize=None)
def _compiler_version(compiler: str) -> str | None:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else None


@functools.lru_cache(maxsize=None)
def cpu_signature() -> str:
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


# ---------------------------------------------------------------------------------------------
# the cached files: checked before dlopen, written durably


def read_private(path: pathlib.Path) -> bytes | None:
    """The bytes of ``path``, None when absent. Looked at with ``lstat`` before opening (never
    through a symlink, never a FIFO or device) and checked again on the open file; it must be a
    regular file of the current user writable by nobody else (RuntimeError otherwise)."""
    try:
        _check_file(path, os.lstat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        _check_file(path, os.fstat(fd))
        return read_all(fd)
    finally:
        os.close(fd)


def _check_file(path: pathlib.Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{os.fspath(path)!r} is not a regular file of the current user "
                           f"writable only by them; refusing to load it (remove it)")


def _cached_library(directory: pathlib.Path, stem: str) -> pathlib.Path | None:
    """The cached library of ``stem`` once its size and sha256 match its record; None when
    nothing is cached. Raises ``_Damaged`` (rebuild) or RuntimeError (unsafe file: refuse)."""
    record_path = directory / f"{stem}.json"
    raw = read_private(record_path)
    if raw is None:
        orphans = _libraries(directory, stem)
        if orphans:
            raise _Damaged(orphans[0], f"no record {record_path.name} beside it (an interrupted "
                                       f"build, or the record was removed)")
        return None
    record = _parse_record(record_path, raw, stem)
    path = directory / record["library"]
    data = read_private(path)
    if data is None:
        raise _Damaged(path, f"missing, though {record_path.name} names it")
    if len(data) != record["size"]:
        raise _Damaged(path, f"{len(data)} bytes, its record says {record['size']} (truncated or "
                             f"overwritten)")
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise _Damaged(path, "its sha256 does not match its record (corrupted or overwritten)")
    return path


def _parse_record(path: pathlib.Path, raw: bytes, stem: str) -> dict:
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Damaged(path, f"not valid JSON ({exc})") from None
    valid = (
        isinstance(record, dict)
        and record.get("format") == _RECORD_FORMAT
        and record.get("version") == _RECORD_VERSION
        and isinstance(record.get("library"), str)
        and re.fullmatch(re.escape(stem) + r"-[0-9a-f]{16}\.so", record["library"]) is not None
        and type(record.get("size")) is int
        and isinstance(record.get("sha256"), str)
        and re.fullmatch(r"[0-9a-f]{64}", record["sha256"]) is not None
    )
    if not valid:
        raise _Damaged(path, f"not a version-{_RECORD_VERSION} record of a {stem} library")
    return record


def _libraries(directory: pathlib.Path, stem: str) -> list[pathlib.Path]:
    return sorted(directory.glob(f"{stem}-*.so"))


def _remove(directory: pathlib.Path, stem: str) -> None:
    """Remove the record, then every library, of ``stem`` (the record first: a crash in between
    leaves libraries without a record, which the next load removes), with the files kept beside
    each library (``<library>.<what>``, e.g. the launch kernels' error-check verdict)."""
    libraries = _libraries(directory, stem)
    beside = [p for lib in libraries for p in directory.glob(glob.escape(lib.name) + ".*")]
    for path in [directory / f"{stem}.json", *libraries, *beside]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _build(name: str, compiler: str, source: pathlib.Path, directory: pathlib.Path,
           stem: str) -> pathlib.Path:
    """Compile ``source`` into ``<stem>-<sha16>.so`` (replacing whatever ``stem`` had), durably:
    temp file, fsync, rename, directory fsync, then the record the same way. Returns the path."""
    _remove(directory, stem)
    tmp = directory / f".tmp-{stem}-{secrets.token_hex(6)}.so"
    cmd = [compiler, *_command_flags(source), os.fspath(source), "-o", os.fspath(tmp),
           *_libraries_flags(source)]
    logger.info("building native CPU kernel %s (first use on this machine): %s", name,
                " ".join(cmd))
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-2000:]}")
        data = _sync_output(tmp)
        digest = hashlib.sha256(data).hexdigest()
        path = directory / f"{stem}-{digest[:16]}.so"
        os.replace(tmp, path)
        fsync_dir(directory)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _write_record(directory, stem, {"format": _RECORD_FORMAT, "version": _RECORD_VERSION,
                                    "library": path.name, "size": len(data), "sha256": digest})
    logger.info("built %s in %.1f s", path, time.perf_counter() - start)
    return path


def _sync_output(tmp: pathlib.Path) -> bytes:
    """Make the compiler's output mode 0600, fsync it, and return its bytes (never empty)."""
    fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            raise RuntimeError(f"the C compiler left no library in {os.fspath(tmp)!r} (an empty "
                               f"or non-regular file); check the compiler ($CC)")
        os.fchmod(fd, FILE_MODE)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        os.fsync(fd)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write_record(directory: pathlib.Path, stem: str, record: dict) -> None:
    """Write ``<stem>.json`` atomically and durably, mode 0600."""
    write_private(directory / f"{stem}.json", json.dumps(record, indent=1, sort_keys=True).encode())


@contextlib.contextmanager
def locked(path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600): one process checks, builds and
    loads a stem at a time, so concurrent first uses build once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, FILE_MODE)
    try:
        _check_file(path, os.fstat(fd))
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sweep(directory: pathlib.Path) -> None:
    """Remove temp files of crashed builds (old ``.tmp-*``); a failure only costs disk space."""
    try:
        sweep_leftovers(directory)
    except (OSError, ValueError) as exc:
        logger.warning("native CPU kernels: could not sweep old temp files from %s (%s)",
                       directory, exc)
