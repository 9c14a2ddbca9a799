"""Reading a ``cache_compile`` entry back, trusting nothing (``torchair.inference._cache_store``).

Everything is checked before it is returned: the entry directory must belong to the current user
and be writable by nobody else, symlinks are refused (``UnsafeCacheError``), every file must be
mode 0600 and match the manifest (``BrokenCacheError`` otherwise: the caller discards the entry).

Only regular files are ever opened: a FIFO, device, socket or directory inside an entry is
classified with ``lstat`` and refused before any ``open`` (opening a FIFO with no writer would
block forever), and the ``open`` itself uses ``O_NONBLOCK | O_NOFOLLOW`` as a second line of
defence, with the type checked again on the open file (the entry could change in between).
"""
from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import stat

from torchair.base.files import FILE_MODE, UnsafeCacheError, check_dir, check_owner_and_mode, fix_hint, read_all
from torchair.inference._cache_manifest import MANIFEST, BrokenCacheError, parse_manifest

__all__ = ["read_entry"]


_KINDS = (
    (stat.S_ISREG, "regular file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def _file_kind(mode: int) -> str:
    """What ``mode`` (from ``lstat``) is, in words, for error messages."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return f"unknown file type {stat.S_IFMT(mode):o}"


def _not_regular(entry_dir: pathlib.Path, name: str, kind: str) -> BrokenCacheError:
    return BrokenCacheError(
        f"broken torchair cache entry {os.fspath(entry_dir)!r}: {name!r} is a {kind}, not a "
        f"regular file; refusing to open it: discard the entry (it is rebuilt)"
    )


def _symlink_refused(entry_dir: pathlib.Path, name: str) -> UnsafeCacheError:
    return UnsafeCacheError(
        f"torchair cache file {os.fspath(entry_dir / name)!r} is a symlink; refusing to read it: "
        f"{fix_hint(entry_dir)}"
    )


def _vanished(entry_dir: pathlib.Path, name: str) -> BrokenCacheError:
    return BrokenCacheError(
        f"broken torchair cache entry {os.fspath(entry_dir)!r}: file {name!r} vanished"
    )


def _lstat_regular(entry_dir: pathlib.Path, dir_fd: int, name: str) -> None:
    """Refuse ``name`` unless it is a regular file, looking without opening or following it: an
    ``open`` of a FIFO with no writer blocks forever, and of a device may have side effects."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise _vanished(entry_dir, name) from None
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_refused(entry_dir, name)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(entry_dir, name, _file_kind(st.st_mode))


def _read_file(entry_dir: pathlib.Path, dir_fd: int, name: str) -> bytes:
    """Read ``name`` relative to the open entry directory without following symlinks; it must be a
    regular file (checked before opening and again on the open file), ours and exactly 0600."""
    path = entry_dir / name
    _lstat_regular(entry_dir, dir_fd, name)
    try:
        # O_NONBLOCK: should a FIFO replace the file after the check, open does not block
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _symlink_refused(entry_dir, name) from None
        if e.errno == errno.ENOENT:
            raise _vanished(entry_dir, name) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the lstat and the open
            raise _not_regular(entry_dir, name, _file_kind(st.st_mode))
        check_owner_and_mode(path, st, "file")
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            raise UnsafeCacheError(
                f"torchair cache file {os.fspath(path)!r} has mode "
                f"{stat.S_IMODE(st.st_mode):o}, expected 600; refusing to use it: "
                f"{fix_hint(entry_dir)}"
            )
        return read_all(fd)
    finally:
        os.close(fd)


def _open_entry_dir(entry_dir: pathlib.Path) -> int | None:
    """An fd on the entry directory (never through a symlink), checked; None when absent."""
    try:
        fd = os.open(entry_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            if os.path.islink(entry_dir):
                check_dir(entry_dir)  # raises UnsafeCacheError naming the symlink
            raise BrokenCacheError(
                f"broken torchair cache entry {os.fspath(entry_dir)!r}: not a directory"
            ) from None
        raise
    try:
        check_owner_and_mode(entry_dir, os.fstat(fd), "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_entry(entry_dir: pathlib.Path) -> dict[str, bytes] | None:
    """The files of the entry ``entry_dir`` (without the manifest), or None when it does not
    exist. Raises ``BrokenCacheError`` for truncated/corrupted/incomplete content and
    ``UnsafeCacheError`` for symlinks, foreign ownership or loose permissions."""
    entry_dir = pathlib.Path(entry_dir)
    try:
        check_dir(entry_dir.parent)
    except FileNotFoundError:
        return None
    dir_fd = _open_entry_dir(entry_dir)
    if dir_fd is None:
        return None
    try:
        return _read_entry_files(entry_dir, dir_fd)
    finally:
        os.close(dir_fd)


def _entry_kind(entry_dir: pathlib.Path, item: os.DirEntry) -> str:
    """What ``item`` is, never following a symlink (``d_type`` first, ``lstat`` when unknown)."""
    if item.is_symlink():
        return "symlink"
    if item.is_file(follow_symlinks=False):
        return "regular file"
    if item.is_dir(follow_symlinks=False):
        return "directory"
    try:
        return _file_kind(item.stat(follow_symlinks=False).st_mode)
    except FileNotFoundError:
        raise _vanished(entry_dir, item.name) from None


def _list_entry(entry_dir: pathlib.Path, dir_fd: int) -> dict[str, str]:
    """``{name: kind}`` of everything in the entry; a symlink is refused at once."""
    present: dict[str, str] = {}
    with os.scandir(dir_fd) as it:
        for item in it:
            kind = _entry_kind(entry_dir, item)
            if kind == "symlink":
                raise _symlink_refused(entry_dir, item.name)
            present[item.name] = kind
    return present


def _read_entry_files(entry_dir: pathlib.Path, dir_fd: int) -> dict[str, bytes]:
    where = f"broken torchair cache entry {os.fspath(entry_dir)!r}"
    present = _list_entry(entry_dir, dir_fd)
    if MANIFEST not in present:
        raise BrokenCacheError(f"{where}: {MANIFEST} is missing (incomplete entry)")
    if present[MANIFEST] != "regular file":
        raise _not_regular(entry_dir, MANIFEST, present[MANIFEST])
    listed = parse_manifest(entry_dir, _read_file(entry_dir, dir_fd, MANIFEST))
    extra = sorted(present.keys() - listed.keys() - {MANIFEST})
    if extra:
        described = ", ".join(f"{name!r} ({present[name]})" for name in extra)
        raise BrokenCacheError(f"{where}: files not in the manifest: {described}")
    out: dict[str, bytes] = {}
    for name, info in listed.items():
        if name not in present:
            raise BrokenCacheError(f"{where}: file {name!r} listed in the manifest is missing")
        if present[name] != "regular file":
            raise _not_regular(entry_dir, name, present[name])
        data = _read_file(entry_dir, dir_fd, name)
        if len(data) != info["size"]:
            raise BrokenCacheError(
                f"{where}: file {name!r} has {len(data)} bytes, the manifest says "
                f"{info['size']} (truncated or overwritten)"
            )
        if hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise BrokenCacheError(f"{where}: file {name!r} does not match its sha256 (corrupted)")
        out[name] = data
    return out
