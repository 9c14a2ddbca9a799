"""Private files on disk, written atomically: the discipline every torchair cache shares.

Both on-disk caches (``cache_compile``'s entries, ``torchair.inference._cache_store``, and the
native kernel builds, ``torchair.ops.toolchain.native``) keep their files in a directory that only
the current user controls, and never let a reader see a half-written file. This module holds the
pieces they share, so the lower layer (kernel builds) does not depend on the upper one (the
compile cache):

- ``ensure_dir`` / ``check_dir``: a directory is created with mode ``DIR_MODE`` (0700); every one
  used must be a real directory (not a symlink), owned by the current user and writable by nobody
  else, otherwise ``UnsafeCacheError`` (the user must act: nothing is repaired silently).
- ``write_new_file``: create a *new* file (``O_EXCL | O_NOFOLLOW``: never through a planted file or
  link), mode exactly ``FILE_MODE`` (0600, whatever the umask), write every byte and ``fsync`` it.
- ``write_file_atomic``: durably replace a file: ``write_new_file`` to a fresh ``.tmp-`` name
  beside it, ``os.replace`` onto the final name, then ``fsync_dir`` of the directory. A reader
  sees the old file or the new one, never a part; a crash leaves at most a ``.tmp-`` file, which
  ``torchair.base.leftovers.sweep_leftovers`` removes later.
- ``fsync_dir``: make a rename in a directory durable.
- ``read_all``: every byte left in an open file descriptor.

Only the standard library and the torchair logger are imported here.
"""
from __future__ import annotations

import os
import pathlib
import secrets
import stat

from torchair.base.log import logger

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "TMP_PREFIX",
    "UnsafeCacheError",
    "check_dir",
    "check_owner_and_mode",
    "ensure_dir",
    "fix_hint",
    "fsync_dir",
    "read_all",
    "write_file_atomic",
    "write_new_file",
]

DIR_MODE = 0o700
FILE_MODE = 0o600
TMP_PREFIX = ".tmp-"


class UnsafeCacheError(PermissionError):
    """A cache path is a symlink, belongs to another user, or is writable by others."""


# ---------------------------------------------------------------------------------------------
# directories


def fix_hint(path: os.PathLike | str) -> str:
    """The end of an ``UnsafeCacheError`` message: what the user can do about ``path``."""
    return f"remove it (`rm -rf {os.fspath(path)}`) or pass another cache_dir"


def check_owner_and_mode(path: pathlib.Path, st: os.stat_result, what: str) -> None:
    """Raise ``UnsafeCacheError`` unless ``st`` (of ``path``, a ``what`` for the message) belongs
    to the current user and is neither group- nor world-writable."""
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(
            f"torchair cache {what} {os.fspath(path)!r} belongs to uid {st.st_uid}, not to the "
            f"current user (uid {os.getuid()}); refusing to use it: {fix_hint(path)}"
        )
    if st.st_mode & 0o022:
        raise UnsafeCacheError(
            f"torchair cache {what} {os.fspath(path)!r} is group- or world-writable "
            f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to use it: `chmod go-w` it or "
            f"{fix_hint(path)}"
        )


def check_dir(path: pathlib.Path) -> None:
    """``path`` exists, is a real directory (not a symlink), ours, and writable by nobody else."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(
            f"torchair cache directory {os.fspath(path)!r} is a symlink; symlinks are refused "
            f"because they can redirect the cache elsewhere: {fix_hint(path)}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(
            f"torchair cache path {os.fspath(path)!r} exists but is not a directory: "
            f"{fix_hint(path)}"
        )
    check_owner_and_mode(path, st, "directory")


def ensure_dir(
    path: str | os.PathLike, *, root: str | os.PathLike | None = None
) -> pathlib.Path:
    """Create ``path`` (mode 0700 for every directory created) and check every component from the
    cache ``root`` down to ``path``: no symlinks, owned by the current user, not group- or
    world-writable. ``root`` defaults to ``path`` itself (then only ``path`` is checked); the
    directories above the root are not checked. Raises ``UnsafeCacheError``."""
    path = pathlib.Path(os.path.abspath(os.fspath(path)))
    root = path if root is None else pathlib.Path(os.path.abspath(os.fspath(root)))
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise ValueError(
            f"ensure_dir: path {os.fspath(path)!r} is not inside the cache root "
            f"{os.fspath(root)!r}; pass a path under the root"
        ) from None
    if not os.path.lexists(root):
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        logger.debug("created torchair cache root %s", root)
    check_dir(root)
    current = root
    for part in rel.parts:
        current = current / part
        if not os.path.lexists(current):  # an existing one is used as is (read-only disks)
            try:
                os.mkdir(current, DIR_MODE)
            except FileExistsError:
                pass
        check_dir(current)
    return path


# ---------------------------------------------------------------------------------------------
# files


def write_new_file(path: pathlib.Path, data: bytes) -> None:
    """Create ``path``, which must not exist (never through a symlink), mode exactly 0600, write
    ``data`` and ``fsync`` it. Not atomic by itself: write to a temp name, then rename (see
    ``write_file_atomic``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have removed bits; make it exactly 0600
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: pathlib.Path) -> None:
    """``fsync`` the directory ``path``, so the renames done in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write ``path`` atomically and durably, mode 0600, never through a planted file or link:
    the data goes to a new ``.tmp-`` file beside it (fsync-ed; swept if this process dies), which
    is renamed into place, then the directory is fsync-ed."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{secrets.token_hex(6)}")
    try:
        write_new_file(tmp, data)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    fsync_dir(path.parent)


def read_all(fd: int) -> bytes:
    """Every byte left in the open file ``fd`` (read in 1 MiB chunks)."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
