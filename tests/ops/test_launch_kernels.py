"""The C++ launch kernel ``torchair_native::ifa_decode`` (torchair/ops/attention/cpu/launch_*.py,
toolchain/csrc/launch_ops.cpp): bit-identical to the general ``npu_incre_flash_attention_tensor``
wherever it computes, the general op's results and errors wherever it does not take the arguments,
the general op's ValueError texts for bad lengths and block ids, masked cache slots never read; a
CPU static unit binds it (and raises what eager raises); the graph the compile cache saves keeps
the general op."""
import ctypes
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torchair
from tests.ops._paging import paged
from torchair.ops.attention.cpu import (
    launch_errors as _launch_errors,
    launch_fakes as _fakes,
    launch_library as _launch,
    launch_probe as _probe,
)
from torchair.ops.attention.incre_flash_attention import incre_flash_attention_reference
from torchair.ops.toolchain import native as _native

pytestmark = pytest.mark.skipif(not _launch.available(),
                                reason="needs the launch kernels (a C and a C++ compiler)")
TWIN = torch.ops.npu.npu_incre_flash_attention_tensor
IFA = torch.ops.npu.npu_incre_flash_attention
LAYOUT_CODES = _launch.LAYOUTS


def _op(q, k, v, lengths, table=None, *, heads=8, nkv=2, layout="BNSD", block_size=0,
        scale=0.125, ends=None, defer=False):
    return _fakes.ifa_decode()(q, k, v, lengths, ends, table, heads, nkv, LAYOUT_CODES[layout],
                               block_size, scale, defer)


def _twin(q, k, v, lengths, table=None, *, heads=8, nkv=2, layout="BNSD", block_size=0,
          scale=0.125):
    return TWIN(q, k, v, actual_seq_lengths=lengths, block_table=table, num_heads=heads,
                num_key_value_heads=nkv, input_layout=layout, block_size=block_size,
                scale_value=scale)


def _bnsd(batch=3, heads=8, nkv=2, dim=64, seq=48, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, 1, dim, generator=g).to(dtype),
            torch.randn(batch, nkv, seq, dim, generator=g).to(dtype),
            torch.randn(batch, nkv, seq, dim, generator=g).to(dtype))


def _in_layout(layout, q, k, v):
    if layout == "BNSD":
        return q, k, v
    if layout == "BSND":
        return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
    return tuple(t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1) for t in (q, k, v))


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
@pytest.mark.parametrize("view", ["columns", "transposed", "every-other"])
def test_a_strided_float_query_gives_the_contiguous_querys_bits(layout, view):
    """A float32 query with gaps between its rows (the query columns of a grouped q/k/v product),
    transposed, or with a step in its last dimension is packed by the kernel: the result is the
    contiguous query's, bit for bit, and the query is not written."""
    q, k, v = _in_layout(layout, *_bnsd(seed=3))
    if view == "columns":  # q's elements as the first columns of a wider tensor
        wide = torch.randn(*q.shape[:-1], q.shape[-1] + 40)
        wide[..., :q.shape[-1]] = q
        strided = wide[..., :q.shape[-1]]
    elif view == "transposed":
        order = list(range(q.dim()))[::-1]  # column-major
        strided = q.permute(order).contiguous().permute(order)
    else:
        wide = torch.zeros(*q.shape[:-1], 2 * q.shape[-1])
        wide[..., ::2] = q
        strided = wide[..., ::2]
    assert not strided.is_contiguous() and torch.equal(strided, q)
    before = strided.clone()
    lt = torch.tensor([48, 7, 30])
    out = _op(strided, k, v, lt, layout=layout)
    assert torch.equal(out, _op(q, k, v, lt, layout=layout))
    assert torch.equal(out, _twin(q, k, v, lt, layout=layout)) and torch.equal(strided, before)


@pytest.mark.parametrize("layout", ["BSH", "BNSD", "BSND"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lengths", [[48, 7, 0], [13], None, [99, 1, 48]],
                         ids=["mixed", "shared", "none", "past-end"])
def test_dense_bit_identical_to_the_general_op(layout, dtype, lengths):
    q, k, v = _in_layout(layout, *_bnsd(dtype=dtype))
    lt = None if lengths is None else torch.tensor(lengths)
    out = _op(q, k, v, lt, layout=layout)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, _twin(q, k, v, lt, layout=layout))
    ref = incre_flash_attention_reference(q, k, v, actual_seq_lengths=lengths, num_heads=8,
                                          num_key_value_heads=2, input_layout=layout,
                                          scale_value=0.125)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("cache", ["paged3", "paged4"])
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_paged_bit_identical_to_the_general_op(cache, table_dtype):
    q, k, v = _bnsd(seq=64)
    kb, table = paged(k, 16, torch.Generator().manual_seed(1))
    vb = paged(v, 16, torch.Generator().manual_seed(1))[0]
    layout = "BNSD"
    if cache == "paged3":  # (blocknum, block_size, H_kv)
        kb = kb.permute(0, 2, 1, 3).reshape(kb.shape[0], 16, -1)
        vb = vb.permute(0, 2, 1, 3).reshape(vb.shape[0], 16, -1)
        q = q.transpose(1, 2).reshape(3, 1, -1)
        layout = "BSH"
    lengths = torch.tensor([64, 17, 33])
    kw = dict(layout=layout, block_size=16)
    out = _op(q, kb, vb, lengths, table.to(table_dtype), **kw)
    assert torch.equal(out, _twin(q, kb, vb, lengths, table, **kw))
    ref = incre_flash_attention_reference(q, kb, vb, actual_seq_lengths=lengths.tolist(),
                                          block_table=table, num_heads=8, num_key_value_heads=2,
                                          input_layout=layout, block_size=16, scale_value=0.125)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_host_window_ends_equal_tensor_lengths():
    q, k, v = _bnsd()
    assert torch.equal(_op(q, k, v, None, ends=[48, 7, 0]),
                       _op(q, k, v, torch.tensor([48, 7, 0])))


@pytest.mark.parametrize("case", ["head-dim-8", "int32-lengths", "kv-strides-differ",
                                  "noncontiguous-table", "ends-on-fallback"])
def test_arguments_it_does_not_take_go_to_the_general_op(case):
    q, k, v = _bnsd()
    lengths, table, kw, ends = torch.tensor([40, 3, 17]), None, {}, None
    if case == "head-dim-8":
        q, k, v = _bnsd(dim=8)
    elif case == "int32-lengths":
        lengths = lengths.int()
    elif case == "kv-strides-differ":
        v = v.transpose(2, 3).contiguous().transpose(2, 3)
    elif case == "noncontiguous-table":
        kb, table = paged(k, 16, torch.Generator().manual_seed(1))
        vb = paged(v, 16, torch.Generator().manual_seed(1))[0]
        k, v = kb, vb
        table = table.t().contiguous().t()  # stride (1, B): columns not contiguous
        kw = dict(block_size=16)
    else:  # host ends with a head dim the kernel does not take: a tensor of them, same result
        q, k, v = _bnsd(dim=8)
        ends = [40, 3, 17]
    out = _op(q, k, v, None if ends else lengths, table, ends=ends, **kw)
    assert out.is_contiguous()
    assert torch.equal(out, _twin(q, k, v, lengths, table, **kw))


def test_fallback_raises_the_general_ops_errors():
    q, k, v = _bnsd()
    with pytest.raises(ValueError, match="actual_seq_lengths has 2 entries"):
        _op(q, k, v, torch.tensor([1, 2]))


@pytest.mark.parametrize("route", ["kernel", "general"])
def test_negative_length_raises_the_general_ops_error(route):
    q, k, v = _bnsd(dim=64 if route == "kernel" else 8)
    msg = r"^npu_incre_flash_attention: actual_seq_lengths\[1\]=-4 must be >= 0$"
    for fn in (_op, _twin):
        with pytest.raises(ValueError, match=msg):
            fn(q, k, v, torch.tensor([5, -4, 3]))


@pytest.mark.parametrize("bad", [-1, 15, 10**9])
def test_bad_block_id_raises_the_general_ops_error(bad):
    q, k, v = _bnsd(seq=64)
    kb, table = paged(k, 16, torch.Generator().manual_seed(2))
    vb = paged(v, 16, torch.Generator().manual_seed(2))[0]
    table[2, 1] = bad  # sequence 2 reads columns 0 and 1 (length 20)
    lengths = torch.tensor([64, 16, 20])
    errors = []
    for fn in (_op, _twin):
        with pytest.raises(ValueError) as info:
            fn(q, kb, vb, lengths, table, block_size=16)
        errors.append(str(info.value))
    assert errors[0] == errors[1], errors
    assert errors[0].startswith(f"npu_incre_flash_attention: block_table[2, 1] = {bad} is not a "
                                f"block of the KV cache (it has {kb.shape[0]} blocks")
    table[1, 2:] = -1  # columns sequence 1 never reads may hold anything
    table[2, 1] = 0
    assert torch.equal(_op(q, kb, vb, lengths, table, block_size=16),
                       _twin(q, kb, vb, lengths, table, block_size=16))


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_masked_cache_slots_are_never_read(poison):
    q, k, v = _bnsd(seq=64)
    lengths = torch.tensor([64, 5, 33])
    clean = _op(q, k, v, lengths)
    keep = torch.arange(64)[None, :] < lengths[:, None]  # [B, S]
    k2 = k.masked_fill(~keep[:, None, :, None], poison)
    v2 = v.masked_fill(~keep[:, None, :, None], poison)
    out = _op(q, k2, v2, lengths)
    assert torch.isfinite(out).all() and torch.equal(out, clean)


def test_zero_lengths_give_zeros_and_fake_shapes():
    q, k, v = _bnsd()
    assert torch.equal(_op(q, k, v, torch.tensor([0])), torch.zeros_like(q))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fq = fq.to(torch.bfloat16)
        out = _op(fq, fk, fv, None)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.is_contiguous()


def test_deferred_errors_are_kept_once_and_cleared():
    """defer_errors=True (static units): no exception; zeros; the first error of the run is
    kept until the unit takes it, and taking clears it."""
    q, k, v = _bnsd(seq=64)
    kb, table = paged(k, 16, torch.Generator().manual_seed(2))
    vb = paged(v, 16, torch.Generator().manual_seed(2))[0]
    assert _launch.take() is None
    out = _op(q, k, v, torch.tensor([5, -4, 3]), defer=True)
    assert torch.equal(out, torch.zeros_like(q))
    bad = table.clone()
    bad[0, 0] = 99
    _op(q, kb, vb, torch.tensor([64, 16, 20]), bad, block_size=16, defer=True)  # a second error
    good = _op(q, k, v, torch.tensor([5, 4, 3]), defer=True)  # a good call still computes
    assert torch.equal(good, _twin(q, k, v, torch.tensor([5, 4, 3])))
    assert _launch.take() == "npu_incre_flash_attention: actual_seq_lengths[1]=-4 must be >= 0"
    assert _launch.take() is None
    run = _launch_errors.checked(lambda args: _op(*args, block_size=16, defer=True))
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 99 is not a block"):
        run([q, kb, vb, torch.tensor([64, 16, 20]), bad])
    assert _launch.take() is None
    # a run that fails later raises the error kept earlier when the engine runs the program in
    # order (eager stops there), its own error otherwise (Inductor may reorder), and leaves
    # nothing behind; with nothing kept, its own error
    def fails_later(args):
        _op(*args, defer=True)
        return 1 / 0

    with pytest.raises(ValueError, match=r"actual_seq_lengths\[0\]=-1"):
        _launch_errors.checked(fails_later, in_order=True)([q, k, v, torch.tensor([-1])])
    assert _launch.take() is None
    with pytest.raises(ZeroDivisionError):
        _launch_errors.checked(fails_later)([q, k, v, torch.tensor([-1])])
    assert _launch.take() is None
    with pytest.raises(ZeroDivisionError):
        _launch_errors.checked(fails_later, in_order=True)([q, k, v, torch.tensor([1])])

    def interrupted(args):
        _op(*args, defer=True)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # an interrupt stays one, and clears what was kept
        _launch_errors.checked(interrupted, in_order=True)([q, k, v, torch.tensor([-1])])
    assert _launch.take() is None


def test_registering_again_is_refused_quietly():
    lib = _native.load("launch_ops", symbols=_launch.SYMBOLS)
    err = ctypes.create_string_buffer(256)
    assert lib.torchair_launch_register(1, err, len(err)) == 0  # already registered: no-op


# ------------------------------------------------------------------------------ static units

class _Step(torch.nn.Module):
    def forward(self, q, k, v, lens):
        out = IFA(q, k, v, actual_seq_lengths=lens, num_heads=8, num_key_value_heads=2,
                  input_layout="BNSD", scale_value=0.125)
        return out + 1


def _compiled(run_eagerly=True):
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = run_eagerly
    config.experimental_config.tiling_schedule_optimize = True
    backend = CompileCounterWithBackend(torchair.get_npu_backend(compiler_config=config))
    return torch.compile(_Step(), backend=backend, dynamic=True, fullgraph=True), backend


def _run(compiled, q, k, v, lens):
    for t in (q, k, v):
        torch._dynamo.mark_static(t)
    with torch.no_grad():
        return compiled(q, k, v, lens)


def _check_static_unit(compiled, backend):
    q, k, v = _bnsd()
    for lens in ([40, 3, 17], [41, 4, 18], [48, 48, 1]):
        assert torch.equal(_run(compiled, q, k, v, lens), IFA(
            q, k, v, actual_seq_lengths=lens, num_heads=8, num_key_value_heads=2,
            input_layout="BNSD", scale_value=0.125) + 1)
    report = torchair.graph_reports()[-1]
    assert report.path == 4 and report.launch_kernels == 1, str(report)
    assert "launch kernels: 1 call(s)" in str(report)
    with pytest.raises(ValueError, match=r"^npu_incre_flash_attention: actual_seq_lengths\[2\]="
                                         r"-1 must be >= 0$"):
        _run(compiled, q, k, v, [40, 3, -1])
    # the next good step is right (the error does not stay behind)
    assert torch.equal(_run(compiled, q, k, v, [40, 3, 17]), IFA(
        q, k, v, actual_seq_lengths=[40, 3, 17], num_heads=8, num_key_value_heads=2,
        input_layout="BNSD", scale_value=0.125) + 1)
    assert backend.frame_count == 1


def test_static_unit_binds_the_launch_kernel_fx_engine():
    _check_static_unit(*_compiled())


@pytest.mark.inductor
def test_static_unit_binds_the_launch_kernel_inductor():
    _check_static_unit(*_compiled(run_eagerly=False))


def test_static_unit_keeps_the_general_op_when_disabled(monkeypatch):
    monkeypatch.setenv(_native.ENV_DISABLE, "0")
    compiled, _ = _compiled()
    q, k, v = _bnsd()
    out = _run(compiled, q, k, v, [40, 3, 17])
    report = torchair.graph_reports()[-1]
    assert report.launch_kernels == 0 and "launch kernels" not in str(report)
    torch.testing.assert_close(out, incre_flash_attention_reference(
        q, k, v, actual_seq_lengths=[40, 3, 17], num_heads=8, num_key_value_heads=2,
        input_layout="BNSD", scale_value=0.125) + 1, atol=1e-5, rtol=1e-5)


def test_bind_leaves_the_traced_graph_alone():
    """The compile cache saves the unit's traced graph: it keeps the general op."""
    from torchair.runtime import units

    seen = {}
    real = units.StaticUnit._engine

    def spy(self, unit_args, what):
        seen["before"] = [n.target for n in self.gm.graph.nodes]
        engine = real(self, unit_args, what)
        seen["after"] = [n.target for n in self.gm.graph.nodes]
        seen["bound"] = [n.target for n in self._launch_graph(unit_args).graph.nodes]
        return engine

    units.StaticUnit._engine = spy
    try:
        compiled, _ = _compiled()
        _run(compiled, *_bnsd(), [40, 3, 17])
    finally:
        units.StaticUnit._engine = real
    assert seen["before"] == seen["after"]
    assert TWIN.default in seen["after"] and _fakes.ifa_decode() not in seen["after"]
    assert _fakes.ifa_decode() in seen["bound"] and TWIN.default not in seen["bound"]


# ------------------------------------------------------------------------------ eager entry

def _python_calls_into_torchair(fn):
    """The torchair functions Python enters while ``fn`` runs."""
    import sys

    seen = []

    def prof(frame, event, arg):
        if event == "call" and "/torchair/" in frame.f_code.co_filename:
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, seen


@pytest.mark.parametrize("twin", [False, True], ids=["host-lengths", "tensor-twin"])
def test_eager_call_runs_no_python_once_its_signature_is_validated(twin):
    from torchair.ops.attention import ifa_fast as _ifa_fast

    q, k, v = _bnsd()
    lengths = [40, 3, 17]
    kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BNSD", scale_value=0.125)

    def call():
        if twin:
            return TWIN(q, k, v, actual_seq_lengths=torch.tensor(lengths), **kw)
        return IFA(q, k, v, actual_seq_lengths=lengths, **kw)

    _ifa_fast.clear()
    first, seen = _python_calls_into_torchair(call)
    assert seen, "the first call of a signature runs the general op (validation)"
    again, seen = _python_calls_into_torchair(call)
    assert seen == [] and torch.equal(again, first)
    with _ifa_fast.disabled():
        general, seen = _python_calls_into_torchair(call)
    assert seen and torch.equal(general, first)


def test_eager_entry_reports_the_general_ops_errors_every_time():
    from torchair.ops.attention import ifa_fast as _ifa_fast

    _ifa_fast.clear()
    q, k, v = _bnsd(seq=64)
    kb, table = paged(k, 16, torch.Generator().manual_seed(2))
    vb = paged(v, 16, torch.Generator().manual_seed(2))[0]
    kw = dict(num_heads=8, num_key_value_heads=2, input_layout="BNSD", scale_value=0.125,
              block_table=table, block_size=16)
    for _ in range(2):  # a signature the general op refuses is never recorded
        with pytest.raises(ValueError, match="block_size=32"):
            IFA(q, kb, vb, actual_seq_lengths=[64, 16, 20], **{**kw, "block_size": 32})
    IFA(q, kb, vb, actual_seq_lengths=[64, 16, 20], **kw)  # validated
    with pytest.raises(ValueError, match=r"actual_seq_lengths\[2\]=-2 must be >= 0"):
        IFA(q, kb, vb, actual_seq_lengths=[64, 16, -2], **kw)
    with pytest.raises(ValueError, match="must be >= maxBlockNumPerSeq=5"):
        IFA(q, kb, vb, actual_seq_lengths=[64, 16, 65], **kw)
    with pytest.raises(ValueError, match="blocknum 15 must be >= the blocks needed"):
        _blocknum_error(q, kb, vb, kw)
    bad = table.clone()
    bad[1, 0] = -7
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = -7 is not a block"):
        IFA(q, kb, vb, actual_seq_lengths=[64, 16, 20], **{**kw, "block_table": bad})
    assert torch.equal(IFA(q, kb, vb, actual_seq_lengths=[64, 16, 20], **kw),
                       _general_ifa(q, kb, vb, actual_seq_lengths=[64, 16, 20], **kw))


def _blocknum_error(q, kb, vb, kw):
    """Lengths whose blocks together exceed the cache (15 blocks) with a wide enough table."""
    wide = {**kw, "block_table": torch.cat([kw["block_table"], kw["block_table"]], 1)}
    IFA(q, kb, vb, actual_seq_lengths=[64, 16, 20], **wide)  # 8 columns, valid ids: validated
    return IFA(q, kb, vb, actual_seq_lengths=[128, 128, 128], **wide)


def _general_ifa(*args, **kwargs):
    from torchair.ops.attention import ifa_fast as _ifa_fast

    with _ifa_fast.disabled():
        return IFA(*args, **kwargs)


# ------------------------------------------------- the error check before a library is used

def test_the_loaded_library_passed_the_error_check_in_a_child():
    with open(_launch.library_path() + ".errors", encoding="utf-8") as f:
        assert f.read().strip() == "ok"


@pytest.mark.parametrize("code, verdict", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "the child was killed by SIGSEGV"),
    ("import sys; print('no ValueError', file=sys.stderr); raise SystemExit(3)",
     "the child exited with 3: no ValueError"),
])
def test_a_library_whose_errors_kill_the_child_is_not_used(tmp_path, monkeypatch, torchair_log,
                                                           code, verdict):
    library = str(tmp_path / "launch_ops-x.so")
    monkeypatch.setattr(_probe, "_PROBE_CODE", code)
    assert not _probe.errors_reach_python(library)
    kept = tmp_path / "launch_ops-x.so.errors"
    assert kept.read_text().strip() == verdict and kept.stat().st_mode & 0o777 == 0o600
    warned = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert any(verdict in m and "general ops" in m and "delete" in m for m in warned), warned
    monkeypatch.setattr(_probe, "_run_probe", lambda lib: pytest.fail("checked twice"))
    assert not _probe.errors_reach_python(library)  # the kept verdict


@pytest.mark.parametrize("code, timeout, verdict", [
    ("raise SystemExit('cannot import')", None, "the child exited with 1: cannot import"),
    ("print('no')", None, "the child exited with 0: no"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None,
     "the child was killed by SIGKILL"),
    ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
     "'import time; time.sleep(60)']); time.sleep(60)", 2.0, "no answer in 2 s"),
])
def test_a_check_that_says_nothing_about_the_library_is_not_kept(tmp_path, monkeypatch,
                                                                  torchair_log, code, timeout,
                                                                  verdict):
    """A child that could not import torchair, was killed by the OOM killer or hung: this
    process does without the library; the next one checks again (no verdict kept)."""
    library = str(tmp_path / "launch_ops-z.so")
    monkeypatch.setattr(_probe, "_PROBE_CODE", code)
    if timeout is not None:
        monkeypatch.setattr(_probe, "PROBE_TIMEOUT_S", timeout)
    start = time.monotonic()
    assert not _probe.errors_reach_python(library)
    assert time.monotonic() - start < 30  # a grandchild holding the pipes is killed too
    assert not (tmp_path / "launch_ops-z.so.errors").exists()
    warned = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert any(verdict in m and "next process checks again" in m for m in warned), warned


def test_a_library_that_passes_is_checked_once(tmp_path, monkeypatch):
    library = str(tmp_path / "launch_ops-y.so")
    monkeypatch.setattr(_probe, "_PROBE_CODE", "print('ok')")
    assert _probe.errors_reach_python(library)
    monkeypatch.setattr(_probe, "_run_probe", lambda lib: pytest.fail("checked twice"))
    assert _probe.errors_reach_python(library)
    monkeypatch.setenv(_probe.PROBE_ENV, "/some/library.so")  # the child itself never checks
    assert _probe.errors_reach_python(str(tmp_path / "never-checked.so"))
    assert not (tmp_path / "never-checked.so.errors").exists()


def test_a_planted_verdict_is_refused(tmp_path, monkeypatch, torchair_log):
    """The verdict is read like the cache's other files: a file others may write, a link or a
    FIFO is refused (no check, no library), never trusted and never waited on."""
    monkeypatch.setattr(_probe, "_run_probe", lambda lib: pytest.fail("probed"))
    open_ok = tmp_path / "a.so.errors"
    open_ok.write_text("ok\n")
    open_ok.chmod(0o666)
    (tmp_path / "b.so.errors").symlink_to(open_ok)
    os.mkfifo(tmp_path / "c.so.errors")
    for name in ("a.so", "b.so", "c.so"):
        assert not _probe.errors_reach_python(str(tmp_path / name))
    warned = [r.getMessage() for r in torchair_log if r.levelno == logging.WARNING]
    assert sum("cannot be used" in m for m in warned) == 3, warned


def test_the_child_checks_the_library_it_was_asked_about():
    """The child imports this torchair and must load the very library named; another one
    (here: a path that is not the loaded library) gives no verdict."""
    verdict, kept = _probe._run_probe("/nonexistent/launch_ops-other.so")
    assert not kept and "not /nonexistent/launch_ops-other.so" in verdict, verdict
    assert _probe._run_probe(_launch.library_path()) == ("ok", True)


def test_a_refused_library_leaves_eager_errors_to_the_general_op(tmp_path):
    """In a process whose kernel cache says the library's errors crash, nothing of it is used
    and eager calls still raise the general op's ValueError."""
    cache = tmp_path / "kernels"
    shutil.copytree(pathlib.Path(_launch.library_path()).parent, cache)
    (cache / (pathlib.Path(_launch.library_path()).name + ".errors")).write_text(
        "the child was killed by SIGSEGV\n")
    script = textwrap.dedent("""
        import torch, torchair
        from torchair.ops.attention.cpu import launch_library
        assert not launch_library.available()
        q, kv = torch.zeros(1, 8, 1, 64), torch.zeros(1, 2, 16, 64)
        try:
            torch.ops.npu.npu_incre_flash_attention(q, kv, kv, actual_seq_lengths=[-1],
                                                    num_heads=8, num_key_value_heads=2,
                                                    input_layout="BNSD", scale_value=0.125)
        except ValueError as exc:
            print("raised:", exc)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240, env=dict(os.environ, TORCHAIR_KERNEL_CACHE=str(cache)))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "raised: " in run.stdout and "actual_seq_lengths" in run.stdout
    assert "killed by SIGSEGV" in run.stderr  # the warning


def test_python_errors_wrapped_by_a_cpp_caller_are_unwrapped():
    """Inductor's C++ wrapper / AOTInductor report a Python op's exception as a RuntimeError
    "<type>: <text>" (pybind11 may add the frames): the unit raises the original type and text;
    other RuntimeErrors stay."""
    for wrapped, want in (("ValueError: op: x[0]=-1 must be >= 0", ValueError),
                          ("ValueError: op: bad\n\nAt:\n  f.py(1): g\n", ValueError),
                          ("NotImplementedError: op: rope", NotImplementedError)):
        error = _launch_errors.eager_error(RuntimeError(wrapped))
        assert type(error) is want and str(error) == wrapped.split(": ", 1)[1].split("\n\n")[0]
    assert _launch_errors.eager_error(RuntimeError("shape mismatch")) is None
    assert _launch_errors.eager_error(ValueError("ValueError: x")) is None  # not wrapped
