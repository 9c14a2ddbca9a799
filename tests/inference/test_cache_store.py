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

from torchair.inference import _cache_read as cache_read, _cache_store as cs
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
    for name in ("torchair", "torchair.base", "torchair.inference"):
        sys.modules[name] = types.ModuleType(name)
    log = types.ModuleType("torchair.base.log")
    log.logger = logging.getLogger("torchair")
    sys.modules["torchair.base.log"] = log

    def load_file(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    store = pathlib.Path(sys.argv[1])  # torchair/inference/_cache_store.py
    for name in ("base/files", "base/leftovers", "inference/_cache_manifest",
                 "inference/_cache_read", "inference/_cache_tensors"):
        load_file("torchair." + name.replace("/", "."), store.parents[1] / f"{name}.py")
    cs = load_file("torchair.inference._cache_store", store)
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


# --- non-regular files: refused without opening -----------------------------------------------


def _read_in_thread(entry, timeout=5.0):
    """``read_entry(entry)`` in a daemon thread: the outcome (value or exception), or a failure
    when it does not return within ``timeout`` s (a FIFO opened without a writer blocks forever:
    a regression hangs visibly, not the whole test run)."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = cs.read_entry(entry)
        except BaseException as e:  # handed to the test thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"read_entry({entry}) blocked for {timeout} s (it opened a FIFO?)")
    return outcome


def _make_fifo(path):
    os.mkfifo(path, 0o600)


def _make_dir(path):
    os.mkdir(path, 0o700)


def _make_chardev(path):
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # like /dev/null
    except PermissionError:
        pytest.skip("creating a character device needs root (mknod: permission denied)")


@pytest.mark.parametrize(
    "make, kind",
    [(_make_fifo, "fifo"), (_make_dir, "directory"), (_make_chardev, "character device")],
)
@pytest.mark.parametrize("name", ["meta.json", cs.MANIFEST])
def test_listed_non_regular_file_refused_without_opening(root, make, kind, name):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    (entry / name).unlink()
    make(entry / name)
    outcome = _read_in_thread(entry)
    assert isinstance(outcome.get("error"), BrokenCacheError), outcome
    message = str(outcome["error"])
    assert f"{name!r} is a {kind}, not a regular file" in message and str(entry) in message
    cs.discard_entry(entry)
    assert cs.write_entry(entry, FILES) is True and cs.read_entry(entry) == FILES


def test_unlisted_fifo_refused_without_opening(root):
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    _make_fifo(entry / "extra.pipe")
    outcome = _read_in_thread(entry)
    assert isinstance(outcome.get("error"), BrokenCacheError), outcome
    assert "not in the manifest: 'extra.pipe' (fifo)" in str(outcome["error"])


def test_fifo_swapped_in_after_the_check_does_not_block(root, monkeypatch):
    """The second line of defence: should a FIFO replace a file between the lstat and the open,
    O_NONBLOCK keeps the open from blocking and the fstat check refuses it."""
    entry = _entry(root)
    cs.write_entry(entry, FILES)
    (entry / "meta.json").unlink()
    _make_fifo(entry / "meta.json")
    monkeypatch.setattr(cache_read, "_lstat_regular", lambda *args: None)
    monkeypatch.setattr(cache_read, "_list_entry", lambda entry_dir, fd: {
        name: "regular file" for name in os.listdir(entry_dir)})
    outcome = _read_in_thread(entry)
    assert isinstance(outcome.get("error"), BrokenCacheError), outcome
    assert "'meta.json' is a fifo" in str(outcome["error"])


# --- sweep_leftovers --------------------------------------------------------------------------


def _age(path, seconds):
    """Set ``path``'s mtime (never through a symlink) ``seconds`` into the past."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _leftover_tree(parent, name, age):
    path = parent / name
    os.mkdir(path, 0o700)
    (path / "data.bin").write_bytes(b"x" * 10)
    os.mkdir(path / "sub", 0o700)
    (path / "sub" / "more.bin").write_bytes(b"y")
    _age(path, age)
    return path


@pytest.fixture
def no_leftover_env(monkeypatch):
    monkeypatch.delenv(cs.LEFTOVER_MAX_AGE_ENV, raising=False)


def test_sweep_removes_old_leftovers_keeps_young_ones(root, no_leftover_env, torchair_log):
    import logging

    entry = _entry(root)
    parent = entry.parent
    cs.write_entry(entry, FILES)
    _leftover_tree(parent, ".tmp-forward-1-aa", 7200)
    _leftover_tree(parent, ".trash-forward-2-bb", 3700)
    (parent / ".tmp-file").write_bytes(b"z")
    _age(parent / ".tmp-file", 4000)
    _leftover_tree(parent, ".tmp-forward-3-young", 60)  # a writer still at work
    _leftover_tree(parent, ".trash-young", 3500)
    removed = cs.sweep_leftovers(parent)
    assert removed == [".tmp-file", ".tmp-forward-1-aa", ".trash-forward-2-bb"]
    assert sorted(p.name for p in parent.iterdir()) == [
        ".tmp-forward-3-young", ".trash-young", "forward"]
    assert cs.read_entry(entry) == FILES
    debug = [r.getMessage() for r in torchair_log if r.levelno == logging.DEBUG]
    info = [r.getMessage() for r in torchair_log if r.levelno == logging.INFO]
    assert sum("removed torchair cache leftover" in m for m in debug) == 3
    assert len(info) == 1 and "removed 3 torchair cache leftover(s)" in info[0]
    torchair_log.clear()
    assert cs.sweep_leftovers(parent) == []
    assert not [r for r in torchair_log if r.levelno >= logging.INFO]  # nothing to say


def test_sweep_never_touches_entries_or_foreign_names(root, no_leftover_env):
    entry = _entry(root)
    parent = entry.parent
    cs.write_entry(entry, FILES)
    for name in ("notes.tmp-", "tmp-x", "trash-y", "unit-build", ".hidden", "x.tmp"):
        (parent / name).write_bytes(b"keep")
        _age(parent / name, 10 ** 6)
    _age(entry, 10 ** 6)
    _age(entry / cs.MANIFEST, 10 ** 6)
    (entry / ".tmp-inside-an-entry").write_bytes(b"not recursive")
    _age(entry / ".tmp-inside-an-entry", 10 ** 6)
    before = sorted(os.listdir(parent))
    assert cs.sweep_leftovers(parent, 0) == []
    assert sorted(os.listdir(parent)) == before
    assert (entry / ".tmp-inside-an-entry").exists()


def test_sweep_removes_symlink_leftovers_not_their_targets(root, tmp_path, no_leftover_env):
    target_dir = cs.ensure_dir(tmp_path / "precious")
    (target_dir / "file").write_bytes(b"precious")
    target_file = tmp_path / "precious.bin"
    target_file.write_bytes(b"precious")
    (root / ".tmp-link-dir").symlink_to(target_dir)
    (root / ".trash-link-file").symlink_to(target_file)
    (root / ".tmp-dangling").symlink_to(tmp_path / "nowhere")
    for name in (".tmp-link-dir", ".trash-link-file", ".tmp-dangling"):
        _age(root / name, 7200)
    _age(target_dir, 0)  # the targets are young: only the links' own mtimes count
    assert cs.sweep_leftovers(root) == [".tmp-dangling", ".tmp-link-dir", ".trash-link-file"]
    assert os.listdir(root) == []
    assert (target_dir / "file").read_bytes() == b"precious"
    assert target_file.read_bytes() == b"precious"


def test_sweep_max_age_env_override_and_argument(root, monkeypatch):
    _leftover_tree(root, ".tmp-a", 600)
    monkeypatch.delenv(cs.LEFTOVER_MAX_AGE_ENV, raising=False)
    assert cs.sweep_leftovers(root) == []  # default: an hour
    monkeypatch.setenv(cs.LEFTOVER_MAX_AGE_ENV, "7200")
    assert cs.sweep_leftovers(root, max_age=300) == [".tmp-a"]  # the argument wins
    _leftover_tree(root, ".tmp-b", 600)
    assert cs.sweep_leftovers(root) == []
    monkeypatch.setenv(cs.LEFTOVER_MAX_AGE_ENV, " 300.5 ")
    assert cs.sweep_leftovers(root) == [".tmp-b"]


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_sweep_invalid_env_value(root, monkeypatch, value):
    _leftover_tree(root, ".tmp-a", 10 ** 6)
    monkeypatch.setenv(cs.LEFTOVER_MAX_AGE_ENV, value)
    with pytest.raises(ValueError, match=rf"{cs.LEFTOVER_MAX_AGE_ENV}=.*expected a number"):
        cs.sweep_leftovers(root)
    assert (root / ".tmp-a").exists()


@pytest.mark.parametrize("bad", [-1, float("nan"), "60", True])
def test_sweep_invalid_max_age(root, bad):
    with pytest.raises(ValueError, match="max_age=.*expected a number of seconds"):
        cs.sweep_leftovers(root, bad)


def test_sweep_custom_prefixes(root, no_leftover_env):
    _leftover_tree(root, "unit-0123", 7200)
    _leftover_tree(root, ".tmp-x", 7200)
    assert cs.sweep_leftovers(root, prefixes=("unit-",)) == ["unit-0123"]
    assert os.listdir(root) == [".tmp-x"]
    for bad in (".tmp-", ("",), (".tmp-", None)):
        with pytest.raises(ValueError, match="prefixes=.*non-empty"):
            cs.sweep_leftovers(root, prefixes=bad)


def test_sweep_refuses_unsafe_directories(root, tmp_path, no_leftover_env):
    _leftover_tree(root, ".tmp-x", 7200)
    os.chmod(root, 0o777)
    with pytest.raises(UnsafeCacheError, match="writable"):
        cs.sweep_leftovers(root)
    os.chmod(root, 0o700)
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(UnsafeCacheError, match="symlink"):
        cs.sweep_leftovers(link)
    assert (root / ".tmp-x").exists()
    assert cs.sweep_leftovers(tmp_path / "missing") == []


def test_sweep_tolerates_concurrent_removal(root, monkeypatch, no_leftover_env):
    """Another sweeper removes leftovers between our listing and our removal (a whole file, and
    part of a directory while we walk it): no error, and the rest is still swept."""
    (root / ".tmp-file").write_bytes(b"x")
    _age(root / ".tmp-file", 7200)
    _leftover_tree(root, ".tmp-dir", 7200)
    _leftover_tree(root, ".trash-dir", 7200)
    real_lstat, real_unlink = os.lstat, os.unlink

    def racing_lstat(path, *args, **kwargs):
        st = real_lstat(path, *args, **kwargs)
        if os.fspath(path).endswith(".tmp-file"):
            real_unlink(path)  # the other sweeper won
        return st

    def racing_unlink(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if os.fspath(path).endswith("data.bin"):
            raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(os, "lstat", racing_lstat)
    monkeypatch.setattr(os, "unlink", racing_unlink)
    removed = cs.sweep_leftovers(root)
    assert ".tmp-file" not in removed
    assert os.listdir(root) == []


def test_the_source_hash_covers_the_c_and_cpp_kernels(tmp_path):
    """An edit of a kernel source alone (launch_ops.cpp, decode_attention.c) gives entries
    another key: an entry's library calls the launch kernels by their schema."""
    import shutil

    import torchair
    from torchair.inference._cache_key import torchair_source_hash as cached

    torchair_source_hash = cached.__wrapped__  # not the per-process cache: files change here
    src = pathlib.Path(torchair.__file__).resolve().parent
    root = tmp_path / "torchair"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = torchair_source_hash(root)
    assert before == torchair_source_hash(src)
    for name in ("launch_ops.cpp", "decode_attention.c"):
        path = next(root.rglob(name))
        path.write_text(path.read_text() + "\n// edited\n")
        after = torchair_source_hash(root)
        assert after != before, name
        before = after
