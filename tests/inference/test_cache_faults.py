"""cache_compile under faults: a read-only or full cache directory degrades to "compiled, not
cached" with one warning; a FIFO in an entry is refused without being opened; leftovers of killed
processes are swept on the next cold start; the ahead-of-time library is keyed by the CPU.

Faults are injected (an ``OSError`` from the system call) so they run everywhere; where this
process may mount a small tmpfs, the same faults are also produced for real (a full filesystem,
then a read-only remount).
"""
import errno
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest
import torch

import torchair
from torchair.inference import _cache_key as keys, cache_compile

NOT_CACHED = "compiled, not cached"


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 8)

    def step(self, x):
        return self.linear(x).relu() * 2


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def _warnings(log):
    return [r.getMessage() for r in log if r.levelname == "WARNING"]


def _calls(cache_dir, n=3):
    """n calls of a fresh cache_compile function; each result must equal eager."""
    model = Model()
    cached = cache_compile(model.step, config=_config(), cache_dir=str(cache_dir))
    for k in range(n):
        x = torch.randn(2 + k, 8)
        with torch.no_grad():
            assert torch.equal(cached(x), model.step(x))
    return cached


def _fail_under(monkeypatch, name, root, code):
    """Make ``os.<name>`` fail with ``code`` for paths (or fds of files) under ``root``."""
    real = getattr(os, name)
    root = str(root)

    def path_of(arg):
        if isinstance(arg, int):
            try:
                return os.readlink(f"/proc/self/fd/{arg}")
            except OSError:
                return ""
        return os.fspath(arg) if isinstance(arg, (str, os.PathLike)) else ""

    def failing(target, *args, **kwargs):
        if path_of(target).startswith(root) and not (name == "mkdir" and os.path.lexists(target)):
            # (mkdir of an existing directory fails with EEXIST even on a read-only disk)
            raise OSError(code, os.strerror(code), path_of(target))
        return real(target, *args, **kwargs)

    monkeypatch.setattr(os, name, failing)


def test_read_only_cache_directory_compiles_and_warns_once(tmp_path, monkeypatch, torchair_log):
    _fail_under(monkeypatch, "mkdir", tmp_path / "c", errno.EROFS)
    _calls(tmp_path / "c")
    warnings = _warnings(torchair_log)
    assert len(warnings) == 1 and NOT_CACHED in warnings[0], warnings
    assert "Read-only file system" in warnings[0]
    assert not (tmp_path / "c").exists()


def test_full_disk_while_writing_the_entry_compiles_and_warns_once(tmp_path, monkeypatch,
                                                                   torchair_log):
    _fail_under(monkeypatch, "write", tmp_path / "c", errno.ENOSPC)
    _calls(tmp_path / "c")
    warnings = _warnings(torchair_log)
    assert len(warnings) == 1 and NOT_CACHED in warnings[0], warnings
    assert "No space left on device" in warnings[0]
    assert not list((tmp_path / "c").rglob("meta.json"))
    assert not list((tmp_path / "c").rglob(".tmp-*"))  # the half-written entry is gone


def test_entry_that_cannot_be_discarded_on_a_read_only_disk(tmp_path, monkeypatch,
                                                            torchair_log):
    _calls(tmp_path / "c", n=1)
    (meta,) = (tmp_path / "c").rglob("meta.json")
    meta.write_bytes(b"{}")  # broken: its manifest digest no longer matches
    torch._dynamo.reset()
    _fail_under(monkeypatch, "rename", tmp_path / "c", errno.EROFS)
    _fail_under(monkeypatch, "mkdir", tmp_path / "c", errno.EROFS)
    _calls(tmp_path / "c")
    warnings = _warnings(torchair_log)
    assert any("broken cache" in w for w in warnings), warnings
    assert any("could not remove" in w for w in warnings), warnings


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs mounted at tmp_path/fs (skips where this process may not mount)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the injected-OSError tests cover the logic")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the injected-OSError "
                    f"tests cover the logic")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_real_full_then_read_only_filesystem(small_tmpfs, torchair_log):
    cache = small_tmpfs / "c"
    cache.mkdir(mode=0o700)
    filler = small_tmpfs / "filler"
    with open(filler, "wb", buffering=0) as f:  # fill it up, leaving a few KB (less than one entry)
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC
    filler.write_bytes(filler.read_bytes()[:-8192])
    _calls(cache)
    warnings = _warnings(torchair_log)
    assert len(warnings) == 1 and NOT_CACHED in warnings[0], warnings
    assert not list(cache.rglob("meta.json")) and not list(cache.rglob(".tmp-*"))

    filler.unlink()
    torch._dynamo.reset()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    del torchair_log[:]
    _calls(cache)
    warnings = _warnings(torchair_log)
    assert len(warnings) == 1 and NOT_CACHED in warnings[0], warnings


def test_fifo_in_an_entry_is_refused_without_opening_it(tmp_path, torchair_log):
    _calls(tmp_path / "c", n=1)
    (code,) = (tmp_path / "c").rglob("code.py")
    code.unlink()
    os.mkfifo(code, 0o600)
    torch._dynamo.reset()

    def hung(signum, frame):
        raise AssertionError("the warm start blocked (opened the FIFO)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        _calls(tmp_path / "c", n=1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    warnings = _warnings(torchair_log)
    assert any("broken cache" in w and "fifo" in w for w in warnings), warnings
    assert code.is_file()  # rebuilt as a regular file


def test_leftovers_of_killed_processes_are_swept_on_the_next_cold_start(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHAIR_CACHE_LEFTOVER_SECONDS", raising=False)
    _calls(tmp_path / "c", n=1)
    (meta,) = (tmp_path / "c").rglob("meta.json")
    entry = meta.parent
    two_hours_ago = time.time() - 2 * 3600
    old = [entry.parent / f".tmp-step-123-{'a' * 16}", entry.parent / ".trash-step-9-b",
           entry.parent / f".tmp-build-step-77-{'c' * 12}",
           entry.parent / "step.inductor" / "aot" / "unit-abc"]
    young = entry.parent / f".tmp-step-456-{'d' * 16}"
    for path in old + [young]:
        path.mkdir(parents=True, mode=0o700)
        (path / "partial.bin").write_bytes(b"x" * 10)
    for path in old:
        os.utime(path, (two_hours_ago, two_hours_ago))
    foreign = entry.parent / "notes.txt"
    foreign.write_text("mine")
    shutil.rmtree(entry)  # the next start is a cold one
    torch._dynamo.reset()
    _calls(tmp_path / "c", n=1)
    assert [p for p in old if p.exists()] == []
    assert young.exists() and foreign.read_text() == "mine"
    assert (entry / "meta.json").is_file()


def test_ahead_of_time_entries_are_keyed_by_the_cpu(monkeypatch):
    from torchair.ops.toolchain import native as _native

    model = Model()
    plain = keys.key_parts(model.step, _config(), True, None)
    aot = keys.key_parts(model.step, _config(), True, None, ge_cache=True)
    assert "cpu" not in plain and aot["cpu"] == keys.cpu_signature()
    monkeypatch.setattr(_native, "cpu_signature", lambda: "x86_64\nflags: sse2")
    other_cpu = keys.key_parts(model.step, _config(), True, None, ge_cache=True)
    assert keys.key_hash(other_cpu) != keys.key_hash(aot)
    monkeypatch.undo()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    capped = keys.key_parts(model.step, _config(), True, None, ge_cache=True)
    assert keys.key_hash(capped) != keys.key_hash(aot)


@pytest.mark.parametrize("switch", ["TORCHAIR_SMALL_GEMM", "TORCHAIR_NATIVE_KERNELS",
                                    "TORCHAIR_LOWER_QUANT"])
def test_ahead_of_time_entries_are_keyed_by_the_build_switches(monkeypatch, switch):
    """A built library holds what the switch chose (products bound to torchair's kernel, quant
    lowered): another switch value is another entry. Entries of the traced graph build under
    each process's own switches, so their key ignores them."""
    model = Model()
    monkeypatch.delenv(switch, raising=False)
    aot = keys.key_parts(model.step, _config(), True, None, ge_cache=True)
    plain = keys.key_parts(model.step, _config(), True, None)
    assert aot["build_switches"][switch] is True and "build_switches" not in plain
    monkeypatch.setenv(switch, "0")
    off = keys.key_parts(model.step, _config(), True, None, ge_cache=True)
    assert off["build_switches"][switch] is False
    assert keys.key_hash(off) != keys.key_hash(aot)
    assert keys.key_hash(keys.key_parts(model.step, _config(), True, None)) == keys.key_hash(plain)


def test_damaged_ahead_of_time_library_in_an_entry_is_rebuilt(tmp_path):
    """The entry's manifest records every file's digest, the library included."""
    from torchair.inference import _cache_store as store

    entry = tmp_path / "c" / "e"
    store.ensure_dir(entry.parent, root=tmp_path / "c")
    store.write_entry(entry, {"meta.json": b"{}", "unit.so": b"\x7fELF" + b"\0" * 4096})
    library = entry / "unit.so"
    library.write_bytes(library.read_bytes()[:100])  # truncated by a crash or a full disk
    with pytest.raises(store.BrokenCacheError, match="unit.so"):
        store.read_entry(entry)
    library.write_bytes(b"")
    with pytest.raises(store.BrokenCacheError, match="unit.so"):
        store.read_entry(entry)
    assert pathlib.Path(library).exists()


def test_a_failed_ahead_of_time_build_is_not_saved_as_complete(tmp_path, monkeypatch, torchair_log):
    """ge_cache: when AOTInductor cannot build the library (a full disk: ENOSPC), the unit is
    compiled in-process and the call is served, but the entry is not saved: saved without its
    ``unit.so`` it looked complete and made every later warm start compile again, silently."""
    import torch._inductor

    from torchair.runtime import engines

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch._inductor, "aot_compile", full_disk)
    # the in-process fallback build: the FX engine stands in for Inductor (seconds, not 15 s)
    monkeypatch.setattr(engines, "inductor_engine",
                        lambda gm, example_inputs, what, **kw: (engines.fx_engine(gm), "inductor"))
    config = torchair.CompilerConfig()  # the Inductor engine: static units are built ahead of time
    model = Model()
    cached = cache_compile(model.step, config=config, cache_dir=str(tmp_path / "c"),
                           ge_cache=True, dynamic=False)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(cached(x), model.step(x))
    warnings = _warnings(torchair_log)
    assert any("AOTInductor could not build the graph (OSError" in w for w in warnings), warnings
    assert any(NOT_CACHED in w and "ahead-of-time build (ge_cache) did not finish" in w
               and "No space left on device" in w for w in warnings), warnings
    assert not list((tmp_path / "c").rglob("meta.json"))  # no entry, complete or not
    assert not list((tmp_path / "c").rglob("unit-*"))  # and no build leftovers
