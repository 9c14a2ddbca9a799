"""The native kernel build cache (``torchair.ops.toolchain.native``): damaged libraries are detected
before ``dlopen`` and rebuilt, missing symbols cause one rebuild then ``None``, and builds are
durable.

Every test builds a tiny ``probe.c`` into its own ``TORCHAIR_KERNEL_CACHE``. A damaged library is
loaded in a child process: should the checks regress, ``dlopen`` of a truncated file kills the
child with SIGBUS, not pytest. The child loads ``_native`` and its file helpers alone (no torch
import), so it starts in a fraction of a second.
"""
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from torchair.ops.toolchain import native as _native

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "cc") is None,
    reason="no C compiler (cc or $CC): native kernels cannot be built here",
)

PROBE = "int probe_add(int a, int b) { return a + b; }\n"
PROBE_V2 = PROBE + "int probe_sub(int a, int b) { return a - b; }\n"

_CHILD = textwrap.dedent(
    """
    import importlib.util, json, logging, pathlib, sys, types

    def load_file(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    # _native and the file helpers alone: importing the torchair package would import torch
    for name in ("torchair", "torchair.base", "torchair.ops"):
        sys.modules[name] = types.ModuleType(name)
    logger = logging.getLogger("torchair")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    package = pathlib.Path(sys.argv[1]).parents[2]  # torchair/ops/toolchain/native.py
    # torchair.base.log imports only the standard library; it keeps the handler set above
    load_file("torchair.base.log", package / "base" / "log.py")
    load_file("torchair.base.files", package / "base" / "files.py")
    load_file("torchair.base.leftovers", package / "base" / "leftovers.py")
    native = load_file("torchair.ops.toolchain.native", sys.argv[1])
    native._SRC_DIR = pathlib.Path(sys.argv[2])
    lib = native.load("probe", symbols=tuple(sys.argv[3:]))
    result = {"loaded": lib is not None}
    if lib is not None:
        result["path"] = lib._name
        result["sum"] = lib.probe_add(2, 40)
    print(json.dumps(result))
    """
)


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """A private kernel cache and a source directory holding ``probe.c``; ``_native`` uses both,
    in this process and in children."""
    cache = tmp_path / "kernels"
    src = tmp_path / "csrc"
    src.mkdir()
    (src / "probe.c").write_text(PROBE)
    monkeypatch.setenv(_native.ENV_CACHE, str(cache))
    monkeypatch.setattr(_native, "_SRC_DIR", src)
    _native._load.cache_clear()
    yield cache
    _native._load.cache_clear()


def _child(cache: pathlib.Path, *symbols: str, wait: bool = True):
    """Load ``probe`` (requiring ``symbols``) in a fresh process: (returncode, result, stderr)."""
    args = [sys.executable, "-c", _CHILD, _native.__file__, os.fspath(_native._SRC_DIR),
            *symbols]
    env = {**os.environ, _native.ENV_CACHE: os.fspath(cache)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=120)
    return proc.returncode, (json.loads(out) if proc.returncode == 0 else None), err


def _files(cache: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, dict]:
    """The one library of ``probe``, its record and the record's content."""
    (lib,) = cache.glob("probe-*.so")
    (record,) = cache.glob("probe-*.json")
    return lib, record, json.loads(record.read_text())


def _built(cache: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, dict]:
    rc, result, err = _child(cache, "probe_add")
    assert rc == 0 and result["loaded"] and result["sum"] == 42, err
    return _files(cache)


def test_build_writes_library_and_record(kernels):
    lib, record, doc = _built(kernels)
    data = lib.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert doc == {"format": "torchair.native_kernel", "version": 1, "library": lib.name,
                   "size": len(data), "sha256": digest}
    assert lib.name == f"{record.stem}-{digest[:16]}.so"
    for path in (lib, record):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(kernels.glob(".tmp-*"))
    rc, result, err = _child(kernels, "probe_add")  # reused, not rebuilt
    assert rc == 0 and result["path"] == os.fspath(lib) and "building" not in err


def _truncate_half(lib, record):
    os.truncate(lib, lib.stat().st_size // 2)


def _empty(lib, record):
    os.truncate(lib, 0)


def _flip_byte(lib, record):
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))


def _no_record(lib, record):
    record.unlink()


def _garbage_record(lib, record):
    record.write_text("{not json")


def _foreign_library_name(lib, record):
    doc = json.loads(record.read_text())
    doc["library"] = "../elsewhere.so"
    record.write_text(json.dumps(doc))


def _no_library(lib, record):
    lib.unlink()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_truncate_half, r"bytes, its record says \d+ \(truncated or overwritten\)"),
        (_empty, r"0 bytes, its record says \d+"),
        (_flip_byte, r"sha256 does not match its record"),
        (_no_record, r"no record probe-\w+\.json beside it"),
        (_garbage_record, r"not valid JSON"),
        (_foreign_library_name, r"not a version-1 record"),
        (_no_library, r"missing, though probe-\w+\.json names it"),
    ],
)
def test_damaged_library_is_rebuilt_before_dlopen(kernels, damage, reason):
    lib, record, _ = _built(kernels)
    damage(lib, record)
    _native._load.cache_clear()
    rc, result, err = _child(kernels, "probe_add")
    assert rc == 0, f"the child died (rc {rc}): the damaged library was loaded?\n{err}"
    assert result["loaded"] and result["sum"] == 42, err
    warning = next(line for line in err.splitlines() if "is damaged" in line)
    assert warning.startswith("WARNING "), warning
    assert re.search(reason, warning), warning
    damaged = record if damage in (_garbage_record, _foreign_library_name) else lib
    assert os.fspath(damaged) in warning and "rebuilding" in warning
    assert "building native CPU kernel probe" in err
    rebuilt, _, doc = _files(kernels)
    assert result["path"] == os.fspath(rebuilt)
    assert rebuilt.stat().st_size == doc["size"] > 0


def test_missing_symbol_rebuilds_once_then_gives_up(kernels, monkeypatch, torchair_log):
    builds = []
    real_build = _native._build
    monkeypatch.setattr(_native, "_build", lambda *a: builds.append(1) or real_build(*a))
    assert _native.load("probe", symbols=("probe_add", "probe_absent")) is None
    assert len(builds) == 2  # the first build and one rebuild
    warnings = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "lacks the symbol(s) probe_absent" in warnings[0] and "rebuilding once" in warnings[0]
    assert "still lacks the symbol(s) probe_absent" in warnings[1]
    assert "PyTorch kernel" in warnings[1]
    lib = _native.load("probe", symbols=("probe_add",))  # the library itself is fine
    assert lib is not None and lib.probe_add(1, 2) == 3 and len(builds) == 2


def test_missing_symbol_fixed_by_the_rebuild_loads_the_new_file(kernels, torchair_log):
    """A cached library that matches its record but lacks a symbol the source now has (planted
    here: the old build under the new source's stem) is rebuilt under a new file name, so
    ``dlopen`` loads the new file, not its handle of the old one."""
    old = _native.load("probe", symbols=("probe_add",))
    old_lib, _, old_doc = _files(kernels)
    (_native._SRC_DIR / "probe.c").write_text(PROBE_V2)
    _native._load.cache_clear()
    assert _native.load("probe", symbols=("probe_sub",)) is not None  # builds the new stem
    new_record = next(p for p in kernels.glob("probe-*.json") if p.stem not in old_lib.name)
    stem = new_record.stem
    for path in kernels.glob(f"{stem}-*.so"):
        path.unlink()
    planted = kernels / f"{stem}-{old_doc['sha256'][:16]}.so"
    shutil.copyfile(old_lib, planted)
    os.chmod(planted, 0o600)
    _native._write_record(kernels, stem, {**old_doc, "library": planted.name})
    _native._load.cache_clear()
    torchair_log.clear()
    lib = _native.load("probe", symbols=("probe_add", "probe_sub"))
    assert lib is not None and lib.probe_sub(5, 3) == 2 and lib._name != os.fspath(planted)
    warnings = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lacks the symbol(s) probe_sub" in warnings[0]
    assert not planted.exists()
    assert old.probe_add(1, 1) == 2


def test_build_fsyncs_before_rename(kernels, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, **kwargs):
        events.append(("rename", os.fspath(src), os.fspath(dst)))
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert _native.load("probe", symbols=("probe_add",)) is not None
    lib, record, _ = _files(kernels)
    directory = os.fspath(kernels.resolve())

    def index(event):
        assert event in events, (event, events)
        return events.index(event)

    (lib_rename,) = [e for e in events if e[0] == "rename" and e[2] == os.fspath(lib)]
    (record_rename,) = [e for e in events if e[0] == "rename" and e[2] == os.fspath(record)]
    lib_tmp, record_tmp = lib_rename[1], record_rename[1]
    assert pathlib.Path(lib_tmp).name.startswith(".tmp-")
    assert pathlib.Path(record_tmp).name.startswith(".tmp-")
    dir_syncs = [i for i, e in enumerate(events) if e == ("fsync", directory)]
    # library: file fsync, rename, directory fsync; only then the record, the same way
    assert index(("fsync", lib_tmp)) < index(lib_rename)
    assert any(index(lib_rename) < i < index(("fsync", record_tmp)) for i in dir_syncs)
    assert index(("fsync", record_tmp)) < index(record_rename)
    assert any(i > index(record_rename) for i in dir_syncs)


def test_concurrent_first_uses_build_once(kernels):
    procs = [_child(kernels, "probe_add", wait=False) for _ in range(3)]
    errs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert json.loads(out)["sum"] == 42
        errs.append(err)
    assert sum("building native CPU kernel probe" in err for err in errs) == 1, errs
    _files(kernels)  # exactly one library and one record


def test_old_temp_files_are_swept(kernels):
    _built(kernels)
    stale = kernels / ".tmp-probe-crashed.so"
    young = kernels / ".tmp-probe-building.so"
    for path in (stale, young):
        path.write_bytes(b"partial")
    os.utime(stale, (0, 0))
    rc, _, err = _child(kernels, "probe_add")
    assert rc == 0, err
    assert not stale.exists() and young.exists()


def test_symbols_must_be_a_tuple_of_names(kernels):
    with pytest.raises(TypeError, match="pass a tuple of symbol names"):
        _native.load("probe", symbols="probe_add")
    with pytest.raises(TypeError, match="non-empty symbol names"):
        _native.load("probe", symbols=("probe_add", ""))


def test_removing_a_stem_removes_the_files_kept_beside_its_libraries(tmp_path):
    stem = "launch_ops-0123"
    files = [f"{stem}.json", f"{stem}-aa.so", f"{stem}-aa.so.errors", f"{stem}-aa.so.errors.lock"]
    for name in [*files, "launch_ops-9999-bb.so.errors"]:
        (tmp_path / name).write_text("x")
    _native._remove(tmp_path, stem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch_ops-9999-bb.so.errors"]
