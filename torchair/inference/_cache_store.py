"""Safe on-disk cache entries for ``cache_compile``.

An *entry* is a directory holding a few flat files plus ``manifest.json`` (sha256 and size of every
file). Entries are published atomically (complete temp directory, then one ``rename``), so readers
see either nothing or a whole entry, and two processes racing on an empty cache both succeed and
leave exactly one entry. Everything read back is checked first: directories must belong to the
current user and be writable by nobody else, symlinks are refused, files must be mode 0600 and
match the manifest. Nothing is ever unpickled without ``weights_only=True``.

Only regular files are ever opened: a FIFO, device, socket or directory inside an entry is
classified with ``lstat`` and refused before any ``open`` (opening a FIFO with no writer would
block forever), and the ``open`` itself uses ``O_NONBLOCK | O_NOFOLLOW`` as a second line of
defence, with the type checked again on the open file (the entry could change in between).

Leftovers of interrupted writers (``.tmp-*`` directories of a publish that never finished,
``.trash-*`` of a discard that never finished) are removed by ``sweep_leftovers`` once they are
older than ``$TORCHAIR_CACHE_LEFTOVER_SECONDS`` (default an hour), so a live writer's temp
directory is never swept from under it.

Errors: ``UnsafeCacheError`` (ownership, symlink, permission problems: the user must act) and
``BrokenCacheError`` (truncated or corrupted content, a non-regular file: the caller discards the
entry and rebuilds).

This module imports torch lazily, so the store itself (and its multi-process tests) start fast.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pathlib
import secrets
import shutil
import stat
import sys
import time
from typing import TYPE_CHECKING

from torchair.base.log import logger

if TYPE_CHECKING:
    import torch

__all__ = [
    "BrokenCacheError",
    "UnsafeCacheError",
    "cache_root",
    "discard_entry",
    "dump_tensors",
    "ensure_dir",
    "load_tensors",
    "read_entry",
    "sweep_leftovers",
    "write_entry",
]

CACHE_HOME_ENV = "TORCHAIR_CACHE_HOME"
LEFTOVER_MAX_AGE_ENV = "TORCHAIR_CACHE_LEFTOVER_SECONDS"
LEFTOVER_PREFIXES = (".tmp-", ".trash-")
_DEFAULT_LEFTOVER_MAX_AGE = 3600.0
MANIFEST = "manifest.json"
_MANIFEST_FORMAT = "torchair.cache_entry"
_MANIFEST_VERSION = 1
_DIR_MODE = 0o700
_FILE_MODE = 0o600


class BrokenCacheError(Exception):
    """A cache entry is truncated, corrupted or incomplete; discard it and rebuild."""


class UnsafeCacheError(PermissionError):
    """A cache path is a symlink, belongs to another user, or is writable by others."""


def cache_root(cache_dir: str | os.PathLike | None) -> pathlib.Path:
    """The cache root as an absolute path: ``cache_dir``, else ``$TORCHAIR_CACHE_HOME``, else
    ``./.torchair_cache`` relative to the current directory. Symlinks are not resolved here (so
    ``ensure_dir`` can refuse them)."""
    if cache_dir is None or str(cache_dir) == "":
        cache_dir = os.environ.get(CACHE_HOME_ENV) or ".torchair_cache"
    return pathlib.Path(os.path.abspath(os.fspath(cache_dir)))


# ---------------------------------------------------------------------------------------------
# checks


def _fix_hint(path: os.PathLike | str) -> str:
    return f"remove it (`rm -rf {os.fspath(path)}`) or pass another cache_dir"


def _check_owner_and_mode(path: pathlib.Path, st: os.stat_result, what: str) -> None:
    if st.st_uid != os.getuid():
        raise UnsafeCacheError(
            f"torchair cache {what} {os.fspath(path)!r} belongs to uid {st.st_uid}, not to the "
            f"current user (uid {os.getuid()}); refusing to use it: {_fix_hint(path)}"
        )
    if st.st_mode & 0o022:
        raise UnsafeCacheError(
            f"torchair cache {what} {os.fspath(path)!r} is group- or world-writable "
            f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to use it: `chmod go-w` it or "
            f"{_fix_hint(path)}"
        )


def _check_dir(path: pathlib.Path) -> None:
    """``path`` exists, is a real directory (not a symlink), ours, and writable by nobody else."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeCacheError(
            f"torchair cache directory {os.fspath(path)!r} is a symlink; symlinks are refused "
            f"because they can redirect the cache elsewhere: {_fix_hint(path)}"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(
            f"torchair cache path {os.fspath(path)!r} exists but is not a directory: "
            f"{_fix_hint(path)}"
        )
    _check_owner_and_mode(path, st, "directory")


def _check_name(name: object) -> str:
    """A simple file name inside an entry: no separators, no ``..``, not hidden, not the
    manifest."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..", MANIFEST)
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        raise ValueError(
            f"cache entry file name {name!r} is invalid: expected a simple relative name (no '/', "
            f"no '..', not hidden, not {MANIFEST!r}); rename the file"
        )
    return name


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
        root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        logger.debug("created torchair cache root %s", root)
    _check_dir(root)
    current = root
    for part in rel.parts:
        current = current / part
        if not os.path.lexists(current):  # an existing one is used as is (read-only disks)
            try:
                os.mkdir(current, _DIR_MODE)
            except FileExistsError:
                pass
        _check_dir(current)
    return path


# ---------------------------------------------------------------------------------------------
# write


def _write_file(path: pathlib.Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)  # the umask may have removed bits; make it exactly 0600
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest(files: dict[str, bytes]) -> bytes:
    entries = {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in sorted(files.items())
    }
    doc = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION, "files": entries}
    return json.dumps(doc, indent=1, sort_keys=True).encode()


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
        _check_name(name)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"write_entry: file {name!r} holds {type(data).__name__}, expected bytes; "
                f"serialize it first (json for metadata, dump_tensors for tensors)"
            )
        payload[name] = bytes(data)
    parent = entry_dir.parent
    _check_dir(parent)
    if os.path.lexists(entry_dir):
        return False
    tmp = parent / f".tmp-{entry_dir.name}-{os.getpid()}-{secrets.token_hex(8)}"
    os.mkdir(tmp, _DIR_MODE)
    try:
        os.chmod(tmp, _DIR_MODE)
        for name, data in payload.items():
            _write_file(tmp / name, data)
        _write_file(tmp / MANIFEST, _manifest(payload))
        _fsync_dir(tmp)
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
    _fsync_dir(parent)
    logger.debug("published cache entry %s (%d files)", entry_dir, len(payload))
    return True


# ---------------------------------------------------------------------------------------------
# read


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
        f"{_fix_hint(entry_dir)}"
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
        _check_owner_and_mode(path, st, "file")
        if stat.S_IMODE(st.st_mode) != _FILE_MODE:
            raise UnsafeCacheError(
                f"torchair cache file {os.fspath(path)!r} has mode "
                f"{stat.S_IMODE(st.st_mode):o}, expected 600; refusing to use it: "
                f"{_fix_hint(entry_dir)}"
            )
        return read_all(fd)
    finally:
        os.close(fd)


def read_all(fd: int) -> bytes:
    """Every byte left in the open file ``fd`` (read in 1 MiB chunks)."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_manifest(entry_dir: pathlib.Path, raw: bytes) -> dict[str, dict]:
    where = f"broken torchair cache entry {os.fspath(entry_dir)!r}"
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BrokenCacheError(f"{where}: {MANIFEST} is not valid JSON ({e})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != _MANIFEST_FORMAT
        or doc.get("version") != _MANIFEST_VERSION
        or not isinstance(doc.get("files"), dict)
    ):
        raise BrokenCacheError(
            f"{where}: {MANIFEST} is not a version-{_MANIFEST_VERSION} torchair manifest"
        )
    files = doc["files"]
    for name, info in files.items():
        try:
            _check_name(name)
        except ValueError:
            raise BrokenCacheError(
                f"{where}: {MANIFEST} lists an invalid file name {name!r}"
            ) from None
        if (
            not isinstance(info, dict)
            or type(info.get("size")) is not int
            or not isinstance(info.get("sha256"), str)
        ):
            raise BrokenCacheError(f"{where}: {MANIFEST} entry for {name!r} is malformed")
    return files


def _open_entry_dir(entry_dir: pathlib.Path) -> int | None:
    """An fd on the entry directory (never through a symlink), checked; None when absent."""
    try:
        fd = os.open(entry_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            if os.path.islink(entry_dir):
                _check_dir(entry_dir)  # raises UnsafeCacheError naming the symlink
            raise BrokenCacheError(
                f"broken torchair cache entry {os.fspath(entry_dir)!r}: not a directory"
            ) from None
        raise
    try:
        _check_owner_and_mode(entry_dir, os.fstat(fd), "directory")
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
        _check_dir(entry_dir.parent)
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
    listed = _parse_manifest(entry_dir, _read_file(entry_dir, dir_fd, MANIFEST))
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


# ---------------------------------------------------------------------------------------------
# leftovers


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
        _check_dir(directory)
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


# ---------------------------------------------------------------------------------------------
# tensors


def dump_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Serialize ``{name: tensor}`` with ``torch.save`` (read back with ``load_tensors``)."""
    import torch

    if not isinstance(tensors, dict):
        raise TypeError(f"dump_tensors: expected dict[str, Tensor], got {type(tensors).__name__}")
    plain: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise TypeError(
                f"dump_tensors: entry {name!r} is {type(t).__name__}, expected a str name and a "
                f"torch.Tensor; only tensors go through torch.save, everything else through JSON"
            )
        plain_t = t.detach()
        full = plain_t.untyped_storage().nbytes() == plain_t.numel() * plain_t.element_size()
        if plain_t.storage_offset() != 0 or not full:
            plain_t = plain_t.clone()  # a view: save its own elements, not the whole base storage
        plain[name] = plain_t
    buf = io.BytesIO()
    torch.save(plain, buf)
    return buf.getvalue()


def load_tensors(data: bytes, map_location=None) -> dict[str, torch.Tensor]:
    """Inverse of ``dump_tensors``; ``torch.load(weights_only=True)`` so a crafted file cannot
    run code. Raises ``BrokenCacheError`` when the data is not a plain ``{name: tensor}``."""
    import torch

    try:
        obj = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as e:  # any failure means the bytes are not a plain tensor file of ours
        raise BrokenCacheError(
            f"broken torchair cache tensors: torch.load(weights_only=True) refused the data "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise BrokenCacheError(
            f"broken torchair cache tensors: expected dict[str, Tensor], got {type(obj).__name__}"
        )
    return obj
