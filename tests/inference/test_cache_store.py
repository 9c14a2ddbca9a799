"""Tests for torchair.inference._cache_store: atomic publish, validation, unsafe paths refused."""
import json
import os
import pathlib
import pickle
import stat
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from torchair.inference import _cache_store as cs
from torchair.inference._cache_store import BrokenCacheError, UnsafeCacheError

FILES = {"meta.json": b'{"a": 1}', "graph.json": b"[1, 2, 3]" * 100, "empty.bin": b""}


@pytest.fixture
def root(tmp_path):
    return cs.ensure_dir(tmp_path / "cache")


def _entry(root):
    parent = cs.ensure_dir(root / "Mod_dynamic_abc" / "world1global_rank0", root=root)
    return parent / "forward"


def _leftovers(path):
    return [p.name for p in path.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


# --- cache_root / ensure_dir ------------------------------------------------------------------


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cs.CACHE_HOME_ENV, raising=False)
    assert cs.cache_root(None) == tmp_path / ".torchair_cache"
    monkeypatch.setenv(cs.CACHE_HOME_ENV, str(tmp_path / "home"))
    assert cs.cache_root(None) == tmp_path / "home"
    assert cs.cache_root("rel") == tmp_path / "rel"
    assert cs.cache_root(tmp_path / "x").is_absolute()


def test_ensure_dir_creates_private_dirs(tmp_path):
    root = tmp_path / "cache"
    leaf = cs.ensure_dir(root / "a" / "b", root=root)
    for d in (root, root / "a", leaf):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert cs.ensure_dir(leaf, root=root) == leaf  # idempotent
    with pytest.raises(ValueError, match="not inside the cache root"):
        cs.ensure_dir(tmp_path / "elsewhere", root=root)


def test_symlinked_cache_root_refused(tmp_path):
    real = cs.ensure_dir(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(UnsafeCacheError, match="symlink") as e:
        cs.ensure_dir(link / "sub", root=link)
    assert str(link) in str(e.value)


def test_symlinked_subdir_refused(root, tmp_path):
    other = cs.ensure_dir(tmp_path / "other")
    (root / "sub").symlink_to(other)
    with pytest.raises(UnsafeCacheError, match="symlink"):
        cs.ensure_dir(root / "sub" / "x", root=root)


def test_group_writable_dir_refused(root):
    sub = cs.ensure_dir(root / "sub", root=root)
    os.chmod(sub, 0o770)
    with pytest.raises(UnsafeCacheError, match="group- or world-writable"):
        cs.ensure_dir(sub / "x", root=root)
    with pytest.raises(UnsafeCacheError, match="writable"):
        cs.read_entry(sub / "entry")


def test_foreign_owner_refused(root, monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: os.stat(root).st_uid + 4242)
    with pytest.raises(UnsafeCacheError, match="not to the current user"):
        cs.ensure_dir(root)


# --- write / read -----------------------------------------------------------------------------


def test_write_then_read(root):
    entry = _entry(root)
    assert cs.read_entry(entry) is None
    assert cs.write_entry(entry, FILES) is True
    assert cs.read_entry(entry) == FILES
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o700
    for name in [*FILES, cs.MANIFEST]:
        assert stat.S_IMODE(os.stat(entry / name).st_mode) == 0o600
    manifest = json.loads((entry / cs.MANIFEST).read_text())
    assert manifest["files"]["meta.json"]["size"] == len(FILES["meta.json"])
    assert _leftovers(entry.parent) == []


def test_second_writer_loses_cleanly(root):
    entry = _entry(root)
    assert cs.write_entry(entry, FILES) is True
    assert cs.write_entry(entry, {"meta.json": b"other"}) is False
    assert cs.read_entry(entry) == FILES
    assert _leftovers(entry.parent) == []


def test_rename_race_lost_after_check(root, monkeypatch):
    """The entry appears between our existence check and our rename: we still lose cleanly."""
    entry = _entry(root)
    real_rename = os.rename

    def racing_rename(src, dst):
        if not os.path.lexists(dst):
            monkeypatch.setattr(os, "rename", real_rename)
            assert cs.write_entry(pathlib.Path(dst), FILES) is True  # the other writer
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", racing_rename)
    assert cs.write_entry(entry, {"meta.json": b"late"}) is False
    assert cs.read_entry(entry) == FILES
    assert _leftovers(entry.parent) == []


def test_no_temp_dir_left_on_error(root, monkeypatch):
    entry = _entry(root)

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="No space"):
        cs.write_entry(entry, FILES)
    assert not entry.exists()
    assert _leftovers(entry.parent) == []


@pytest.mark.parametrize("name", ["a/b", "../x", "..", ".", ".hidden", "", cs.MANIFEST, "a\\b"])
def test_bad_file_names_rejected(root, name):
    entry = _entry(root)
    with pytest.raises(ValueError, match="invalid"):
        cs.write_entry(entry, {name: b"x"})
    assert not entry.exists() and _leftovers(entry.parent) == []


def test_non_bytes_rejected(root):
    with pytest.raises(TypeError, match="expected bytes"):
        cs.write_entry(_entry(root), {"meta.json": {"a": 1}})


_CHILD = textwrap.dedent(
    """
    import importlib.util, logging, os, pathlib, sys, time, types
    # Load the store alone: importing the torchair package would import torch (seconds).
    for name in ("torchair", "torchair.core"):
        sys.modules[name] = types.ModuleType(name)
    utils = types.ModuleType("torchair.core.utils")
    utils.logger = logging.getLogger("torchair")
    sys.modules["torchair.core.utils"] = utils
    spec = importlib.util.spec_from_file_location("_cache_store", sys.argv[1])
    cs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cs)
    root, ready, go, who = map(pathlib.Path, sys.argv[2:6])
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    results = []
    for i in range(20):
        parent = cs.ensure_dir(root / f"Mod_dynamic_{i}" / "world2global_rank0", root=root)
        entry = parent / "forward"
        won = cs.write_entry(entry, {"meta.json": b"same", "who.txt": who.name.encode() * 1000})
        assert cs.read_entry(entry) is not None
        results.append("1" if won else "0")
    print("".join(results))
    """
)


def test_two_processes_race_on_empty_cache(tmp_path):
    root = tmp_path / "cache"  # does not exist yet: both processes create it
    go = tmp_path / "go"
    store = pathlib.Path(cs.__file__)
    procs = []
    for who in ("p0", "p1"):
        ready = tmp_path / f"ready-{who}"
        args = [sys.executable, "-c", _CHILD, str(store), str(root), str(ready), str(go), who]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((ready, proc))
    deadline = time.monotonic() + 30
    while not all(ready.exists() for ready, _ in procs):  # barrier: both started
        assert time.monotonic() < deadline, "child processes did not start"
        time.sleep(0.005)
    go.touch()
    outs = []
    for _, p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
        outs.append(out.decode().strip())
    # every entry was published by exactly one of the two processes
    assert all(a != b for a, b in zip(*outs)), outs
    for i in range(20):
        parent = root / f"Mod_dynamic_{i}" / "world2global_rank0"
        assert sorted(p.name for p in parent.iterdir()) == ["forward"]
        files = cs.read_entry(parent / "forward")
        assert files["meta.json"] == b"same"
        assert files["who.txt"] in (b"p0" * 1000, b"p1" * 1000)


# --- broken entries ---------------------------------------------------------------------------


def _corrupt_truncate(entry):
    data = (entry / "graph.json").read_bytes()
    (entry / "graph.json").write_bytes(data[:-5])


def _corrupt_flip(entry):
    data = bytearray((entry / "graph.json").read_bytes())
    data[10] ^= 0x01
    (entry / "graph.json").write_bytes(bytes(data))


def _corrupt_missing(entry):
    (entry / "meta.json").unlink()


def _corrupt_extra(entry):
    fd = os.open(entry / "extra.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)


def _corrupt_extra_dir(entry):
    os.mkdir(entry / "sub", 0o700)


def _corrupt_manifest_json(entry):
    (entry / cs.MANIFEST).write_bytes(b"{not json")


def _corrupt_manifest_shape(entry):
    (entry / cs.MANIFEST).write_text(json.dumps({"format": "torchair.cache_entry", "version": 1,
                                                 "files": {"../etc/passwd": {"size": 1}}}))


def _corrupt_manifest_missing(entry):
    (entry / cs.MANIFEST).unlink()


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (_corrupt_truncate, "truncated"),
        (_corrupt_flip, "sha256"),
        (_corrupt_missing, "missing"),
        (_corrupt_extra, "not in the manifest"),
        (_corrupt_extra_dir, "not in the manifest"),
        (_corrupt_manifest_json, "not valid JSON"),
        (_corrupt_manifest_shape, "invalid file name"),
        (_corrupt_manifest_missing, "manifest.json is missing"),
    ],
)
def test_broken_entries_detected_and_discarded(root, corrupt, message):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    corrupt(entry)
    with pytest.raises(BrokenCacheError, match=message) as e:
        cs.read_entry(entry)
    assert "broken torchair cache entry" in str(e.value)
    cs.discard_entry(entry)
    assert cs.read_entry(entry) is None
    assert _leftovers(entry.parent) == []
    assert cs.write_entry(entry, FILES) is True  # rebuild
    assert cs.read_entry(entry) == FILES


def test_entry_that_is_a_file_is_broken(root):
    entry = _entry(root)
    entry.write_bytes(b"x")
    with pytest.raises(BrokenCacheError, match="not a directory"):
        cs.read_entry(entry)
    cs.discard_entry(entry)
    assert not os.path.lexists(entry)


def test_discard_tolerates_missing_entry(root):
    cs.discard_entry(_entry(root))  # nothing there: no error


# --- unsafe entries ---------------------------------------------------------------------------


def test_symlinked_entry_dir_refused(root, tmp_path):
    entry = _entry(root)
    elsewhere = cs.ensure_dir(tmp_path / "elsewhere")
    cs.write_entry(elsewhere / "forward", FILES)
    entry.symlink_to(elsewhere / "forward")
    with pytest.raises(UnsafeCacheError, match="symlink"):
        cs.read_entry(entry)
    assert cs.write_entry(entry, FILES) is False  # never writes through the link
    cs.discard_entry(entry)  # removes the link, not its target
    assert not os.path.lexists(entry)
    assert cs.read_entry(elsewhere / "forward") == FILES


def test_symlinked_file_refused(root, tmp_path):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    target = tmp_path / "target"
    target.write_bytes(FILES["meta.json"])
    os.chmod(target, 0o600)
    (entry / "meta.json").unlink()
    (entry / "meta.json").symlink_to(target)
    with pytest.raises(UnsafeCacheError, match="symlink"):
        cs.read_entry(entry)


def test_loose_file_mode_refused(root):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    os.chmod(entry / "meta.json", 0o644)
    with pytest.raises(UnsafeCacheError, match="expected 600"):
        cs.read_entry(entry)


def test_group_writable_entry_refused(root):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    os.chmod(entry, 0o770)
    with pytest.raises(UnsafeCacheError, match="writable"):
        cs.read_entry(entry)


def test_foreign_entry_refused(root, monkeypatch):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    with pytest.raises(UnsafeCacheError, match="current user"):
        cs.read_entry(entry)
    with pytest.raises(UnsafeCacheError, match="current user"):
        cs.write_entry(entry.parent / "other", FILES)


def test_umask_does_not_matter(root):
    old = os.umask(0o077)
    try:
        entry = _entry(root)
        cs.write_entry(entry, FILES)
    finally:
        os.umask(old)
    assert cs.read_entry(entry) == FILES


# --- tensors ----------------------------------------------------------------------------------


def test_tensors_round_trip():
    base = torch.arange(100, dtype=torch.float32)
    tensors = {
        "w": torch.randn(3, 4),
        "view": base[10:20],
        "i": torch.tensor([1, 2], dtype=torch.int8),
        "p": torch.nn.Parameter(torch.ones(2)),
    }
    data = cs.dump_tensors(tensors)
    back = cs.load_tensors(data)
    assert set(back) == set(tensors)
    for k, t in tensors.items():
        assert torch.equal(back[k], t.detach()) and back[k].dtype == t.dtype
    assert back["view"].untyped_storage().nbytes() == 10 * 4  # the view alone was saved


def test_dump_tensors_rejects_non_tensors():
    with pytest.raises(TypeError, match=r"expected a str name and a torch\.Tensor"):
        cs.dump_tensors({"x": [1, 2]})


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_load_tensors_refuses_code_execution(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"x": _Evil(marker)})
    with pytest.raises(BrokenCacheError, match="weights_only"):
        cs.load_tensors(payload)
    # the same payload inside a torch.save zip container
    import io

    buf = io.BytesIO()
    torch.save({"x": _Evil(marker)}, buf)
    with pytest.raises(BrokenCacheError, match="weights_only"):
        cs.load_tensors(buf.getvalue())
    assert not marker.exists()


def test_load_tensors_rejects_non_dict_and_garbage():
    import io

    buf = io.BytesIO()
    torch.save([torch.ones(1)], buf)
    with pytest.raises(BrokenCacheError, match="expected dict"):
        cs.load_tensors(buf.getvalue())
    with pytest.raises(BrokenCacheError):
        cs.load_tensors(b"garbage")


def test_read_entry_under_missing_parent_is_none(root):
    assert cs.read_entry(root / "no" / "such" / "forward") is None
