"""Sweeping the leftovers of interrupted writers out of a private cache directory.

A writer that dies between creating its temp name and renaming it into place (an atomic write of
``torchair.base.files``, a ``cache_compile`` entry being published or discarded, a kernel build)
leaves a ``.tmp-*`` or ``.trash-*`` item behind. ``sweep_leftovers`` removes those once they are
older than ``$TORCHAIR_CACHE_LEFTOVER_SECONDS`` (default an hour), so a live writer's temp file is
never swept from under it. Shared by ``cache_compile``'s store and the native kernel builds.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import stat
import sys
import time

from torchair.base.files import check_dir
from torchair.base.log import logger

__all__ = ["LEFTOVER_MAX_AGE_ENV", "LEFTOVER_PREFIXES", "sweep_leftovers"]

LEFTOVER_MAX_AGE_ENV = "TORCHAIR_CACHE_LEFTOVER_SECONDS"
LEFTOVER_PREFIXES = (".tmp-", ".trash-")
_DEFAULT_LEFTOVER_MAX_AGE = 3600.0


def _leftover_max_age(max_age: float | None) -> float:
    """``max_age`` if given, else ``$TORCHAIR_CACHE_LEFTOVER_SECONDS``, else an hour; seconds,
    finite and not negative."""
    if max_age is None:
        raw = os.environ.get(LEFTOVER_MAX_AGE_ENV, "").strip()
        if not raw:
            return _DEFAULT_LEFTOVER_MAX_AGE
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0.0 <= value < float("inf"):
            raise ValueError(
                f"{LEFTOVER_MAX_AGE_ENV}={raw!r} is invalid: expected a number of seconds >= 0 "
                f"(the age after which cache leftovers are removed, default "
                f"{_DEFAULT_LEFTOVER_MAX_AGE:.0f}); fix or unset it"
            )
        return value
    if isinstance(max_age, bool) or not isinstance(max_age, (int, float)) or not (
        0.0 <= max_age < float("inf")
    ):
        raise ValueError(
            f"sweep_leftovers: max_age={max_age!r} is invalid: expected a number of seconds >= 0, "
            f"or None for ${LEFTOVER_MAX_AGE_ENV} (default {_DEFAULT_LEFTOVER_MAX_AGE:.0f})"
        )
    return float(max_age)


def _check_prefixes(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    if isinstance(prefixes, str) or not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(
            f"sweep_leftovers: prefixes={prefixes!r} is invalid: expected a tuple of non-empty "
            f"name prefixes, e.g. {LEFTOVER_PREFIXES!r}"
        )
    return tuple(prefixes)


def _ignore_vanished(func, path, exc) -> None:
    """``shutil.rmtree`` error hook: something removed concurrently is not an error."""
    exc = exc if isinstance(exc, BaseException) else exc[1]  # onexc gets it, onerror a tuple
    if not isinstance(exc, FileNotFoundError):
        raise exc


def _remove_leftover(path: pathlib.Path, st: os.stat_result) -> None:
    """Remove ``path`` (as seen by ``lstat``): a directory with its contents, anything else (a
    symlink included, never its target) with ``unlink``. Raises FileNotFoundError when ``path``
    itself was already gone; parts of a directory removed concurrently are not an error."""
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    elif sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_ignore_vanished)
    else:
        shutil.rmtree(path, onerror=_ignore_vanished)


def sweep_leftovers(
    directory: str | os.PathLike,
    max_age: float | None = None,
    *,
    prefixes: tuple[str, ...] = LEFTOVER_PREFIXES,
) -> list[str]:
    """Remove the leftovers of interrupted writers in ``directory`` and return their names.

    A leftover is an item directly in ``directory`` (not recursive) whose name starts with one of
    ``prefixes`` (default ``.tmp-`` and ``.trash-``; a caller may pass its own build leftovers,
    e.g. ``("unit-",)``) and whose ``lstat`` mtime is more than ``max_age`` seconds old (None:
    ``$TORCHAIR_CACHE_LEFTOVER_SECONDS``, else 3600). Young leftovers are kept: they may belong
    to a writer still at work. Symlinks are removed themselves, never followed; entries, manifests
    and other names are never touched. Something removed concurrently is skipped silently; a
    leftover that cannot be removed for another reason is logged as a warning and skipped, since
    sweeping is housekeeping. A missing ``directory`` has no leftovers.

    Raises ``UnsafeCacheError`` when ``directory`` is a symlink, someone else's, or writable by
    others (see ``ensure_dir``), and ``ValueError`` for an invalid ``max_age``, ``prefixes`` or
    ``$TORCHAIR_CACHE_LEFTOVER_SECONDS``.
    """
    limit = _leftover_max_age(max_age)
    prefixes = _check_prefixes(prefixes)
    directory = pathlib.Path(os.path.abspath(os.fspath(directory)))
    try:
        check_dir(directory)
        with os.scandir(directory) as it:
            names = sorted(item.name for item in it if item.name.startswith(prefixes))
    except FileNotFoundError:
        return []
    now = time.time()
    removed = []
    for name in names:
        path = directory / name
        try:
            st = os.lstat(path)
            age = now - st.st_mtime
            if age <= limit:
                continue
            _remove_leftover(path, st)
        except FileNotFoundError:
            continue
        except OSError as e:
            logger.warning("could not remove the torchair cache leftover %s (%s); remove it by "
                           "hand (`rm -rf %s`)", path, e, path)
            continue
        logger.debug("removed torchair cache leftover %s (%.0f s old)", path, age)
        removed.append(name)
    if removed:
        logger.info("removed %d torchair cache leftover(s) older than %.0f s from %s",
                    len(removed), limit, directory)
    return removed
