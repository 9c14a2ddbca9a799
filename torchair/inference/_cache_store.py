"""Safe on-disk cache entries for ``cache_compile``: the store's API.

An *entry* is a directory holding a few flat files plus ``manifest.json`` (sha256 and size of every
file; see ``torchair.inference._cache_manifest``). Entries are published atomically (complete temp
directory, then one ``rename``), so readers see either nothing or a whole entry, and two processes
racing on an empty cache both succeed and leave exactly one entry. Everything read back is checked
first (``torchair.inference._cache_read``): directories must belong to the current user and be
writable by nobody else, symlinks are refused, files must be mode 0600 and match the manifest.
Nothing is ever unpickled without ``weights_only=True`` (``torchair.inference._cache_tensors``).

Leftovers of interrupted writers (``.tmp-*`` directories of a publish that never finished,
``.trash-*`` of a discard that never finished) are removed by ``sweep_leftovers`` once they are
older than ``$TORCHAIR_CACHE_LEFTOVER_SECONDS`` (default an hour), so a live writer's temp
directory is never swept from under it.

Errors: ``UnsafeCacheError`` (ownership, symlink, permission problems: the user must act) and
``BrokenCacheError`` (truncated or corrupted content, a non-regular file: the caller discards the
entry and rebuilds).

This module (writing and discarding entries) is what the rest of ``cache_compile`` imports; the
directory checks, atomic writes and leftover sweeping it shares with the native kernel builds live
in ``torchair.base.files`` and ``torchair.base.leftovers`` and are re-exported here. It imports
torch lazily, so the store itself (and its multi-process tests) start fast.
"""
from __future__ import annotations

import errno
import os
import pathlib
import secrets
import shutil
import stat

from torchair.base.files import (
    DIR_MODE,
    TMP_PREFIX,
    UnsafeCacheError,
    check_dir,
    ensure_dir,
    fsync_dir,
    read_all,
    write_new_file,
)
from torchair.base.leftovers import LEFTOVER_MAX_AGE_ENV, LEFTOVER_PREFIXES, sweep_leftovers
from torchair.base.log import logger
from torchair.inference._cache_manifest import MANIFEST, BrokenCacheError, build_manifest, check_name
from torchair.inference._cache_read import read_entry
from torchair.inference._cache_tensors import dump_tensors, load_tensors

__all__ = [
    "BrokenCacheError",
    "CACHE_HOME_ENV",
    "LEFTOVER_MAX_AGE_ENV",
    "LEFTOVER_PREFIXES",
    "MANIFEST",
    "UnsafeCacheError",
    "cache_root",
    "discard_entry",
    "dump_tensors",
    "ensure_dir",
    "load_tensors",
    "read_all",
    "read_entry",
    "sweep_leftovers",
    "write_entry",
]

CACHE_HOME_ENV = "TORCHAIR_CACHE_HOME"


def cache_root(cache_dir: str | os.PathLike | None) -> pathlib.Path:
    """The cache root as an absolute path: ``cache_dir``, else ``$TORCHAIR_CACHE_HOME``, else
    ``./.torchair_cache`` relative to the current directory. Symlinks are not resolved here (so
    ``ensure_dir`` can refuse them)."""
    if cache_dir is None or str(cache_dir) == "":
        cache_dir = os.environ.get(CACHE_HOME_ENV) or ".torchair_cache"
    return pathlib.Path(os.path.abspath(os.fspath(cache_dir)))


def write_entry(entry_dir: pathlib.Path, files: dict[str, bytes]) -> bool:
    """Publish ``files`` (name -> content) as the entry ``entry_dir``, atomically.

    Returns True when this call published the entry, False when ``entry_dir`` already existed
    (another process won the race; ours is discarded). The parent directory must exist (see
    ``ensure_dir``). No temp directory is left behind, even on error."""
    entry_dir = pathlib.Path(entry_dir)
    if not isinstance(files, dict):
        raise TypeError(
            f"write_entry: files must be a dict[str, bytes], got {type(files).__name__}"
        )
    payload: dict[str, bytes] = {}
    for name, data in files.items():
        check_name(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"write_entry: file {name!r} holds {type(data).__name__}, expected bytes; "
                f"serialize it first (json for metadata, dump_tensors for tensors)"
            )
        payload[name] = bytes(data)
    parent = entry_dir.parent
    check_dir(parent)
    if os.path.lexists(entry_dir):
        return False
    tmp = parent / f"{TMP_PREFIX}{entry_dir.name}-{os.getpid()}-{secrets.token_hex(8)}"
    os.mkdir(tmp, DIR_MODE)
    try:
        os.chmod(tmp, DIR_MODE)
        for name, data in payload.items():
            write_new_file(tmp / name, data)
        write_new_file(tmp / MANIFEST, build_manifest(payload))
        fsync_dir(tmp)
        if os.path.lexists(entry_dir):
            published = False
        else:
            try:
                os.rename(tmp, entry_dir)
                published = True
            except OSError as e:
                # rename onto an existing non-empty directory: another writer won
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
                published = False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not published:
        shutil.rmtree(tmp, ignore_errors=True)
        logger.debug("cache entry %s was published by another process first", entry_dir)
        return False
    fsync_dir(parent)
    logger.debug("published cache entry %s (%d files)", entry_dir, len(payload))
    return True


def discard_entry(entry_dir: pathlib.Path) -> None:
    """Remove an entry (typically a broken one): rename it out of the way first, so readers never
    see a half-deleted entry, then delete it. A concurrent removal is not an error; a symlink is
    removed itself, never its target."""
    entry_dir = pathlib.Path(entry_dir)
    trash = entry_dir.parent / f".trash-{entry_dir.name}-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        os.rename(entry_dir, trash)
    except FileNotFoundError:
        return
    logger.debug("discarding cache entry %s", entry_dir)
    st = os.lstat(trash)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(trash, ignore_errors=True)
    else:
        try:
            os.unlink(trash)
        except FileNotFoundError:
            pass
