"""The format of a ``cache_compile`` entry: its ``manifest.json`` and the names of its files.

An entry is a directory of flat files plus ``manifest.json``, which lists the sha256 and size of
every other file (``build_manifest`` when writing, ``parse_manifest`` when reading back; see
``torchair.inference._cache_store``). File names are simple relative names (``check_name``).
Content that does not match its manifest raises ``BrokenCacheError``: the caller discards the
entry and rebuilds.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib

__all__ = ["MANIFEST", "BrokenCacheError", "build_manifest", "check_name", "parse_manifest"]

MANIFEST = "manifest.json"
_MANIFEST_FORMAT = "torchair.cache_entry"
_MANIFEST_VERSION = 1


class BrokenCacheError(Exception):
    """A cache entry is truncated, corrupted or incomplete; discard it and rebuild."""


def check_name(name: object) -> str:
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


def build_manifest(files: dict[str, bytes]) -> bytes:
    """``manifest.json`` for ``files`` (name -> content): each file's size and sha256."""
    entries = {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in sorted(files.items())
    }
    doc = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION, "files": entries}
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def parse_manifest(entry_dir: pathlib.Path, raw: bytes) -> dict[str, dict]:
    """The ``files`` table of the manifest ``raw`` read from ``entry_dir`` (name -> size and
    sha256), every name and record checked; ``BrokenCacheError`` otherwise."""
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
            check_name(name)
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
