"""The Triton kernels compile for an H100 (sm_90) without a GPU:
``torchair.ops.toolchain.triton_aot``.

The interpreter tests check what the kernels compute; these check what a GPU would run: every
kernel of the catalog (``torchair.ops.toolchain.triton_aot.CASES``: each Triton kernel at serving
shapes, in the variants the ops launch) compiles through its real wrapper down to a sm_90 cubin with
Triton's own ptxas, without register spills, within the shared memory of one SM, and with 16-byte
global loads for the 16-bit KV tiles of decode attention. Triton compiles only in a process that did
not import it with ``TRITON_INTERPRET=1`` (which tests/conftest.py sets without a GPU), so these run
in child processes.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from torchair.ops.toolchain import triton_aot as aot

ROOT = pathlib.Path(__file__).resolve().parents[2]
SM90_MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB)


@pytest.fixture(scope="module", autouse=True)
def _private_triton_cache(tmp_path_factory):
    """The children compile into a fresh cache (a real compile, nothing left in ~/.triton)."""
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    yield
    if old is None:
        del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = old


def _run(args, *, interpret: bool, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    res = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=timeout, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    path = tmp_path_factory.mktemp("aot") / "sm90.json"
    out = _run(["-m", "torchair.ops.toolchain.triton_aot", "--arch", "90", "--json", str(path)],
               interpret=False)
    return json.loads(path.read_text()), out


def test_every_catalog_case_compiles_for_sm90_subprocess(sm90):
    report, out = sm90
    assert report["arch"] == 90 and report["sm_count"] == aot.H100_SMS
    rows = report["rows"]
    assert {r["case"] for r in rows} == set(aot.CASES)
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"_split_kv_kernel", "_merge_splits_kernel", "_rms_norm_kernel",
                       "_quant_kernel", "_quant_matmul_kernel", "_swiglu_quant_kernel"}
    assert f"{len(rows)} launches compiled for sm_90" in out


def test_no_spills_and_shared_memory_fits_subprocess(sm90):
    for row in sm90[0]["rows"]:
        where = f"{row['case']} / {row['kernel']}"
        assert 0 < row["registers"] <= 255, where
        assert row["local_bytes"] == 0, f"{where} spills {row['local_bytes']} bytes per thread"
        assert row["shared_bytes"] <= SM90_MAX_SHARED, where


def test_decode_kv_tiles_load_16_bytes_at_a_time_subprocess(sm90):
    rows = [r for r in sm90[0]["rows"] if r["kernel"] == "_split_kv_kernel"
            and ("fp16" in r["case"] or "bf16" in r["case"]) and "int8" not in r["case"]]
    assert len(rows) >= 6
    for row in rows:
        # K and V tiles of 16-bit values: vectorized 16-byte loads, never element by element.
        assert row.get("ld_global_16B", 0) >= 16, row
        assert "ld_global_2B" not in row, row


def test_decode_paged_blocks_of_128_read_one_block_id_per_chunk_subprocess(sm90):
    rows = {r["case"]: r for r in sm90[0]["rows"] if r["kernel"] == "_split_kv_kernel"}
    aligned = rows["decode fp16 paged bs128 32k"]
    gathered = rows["decode bf16 paged bs16 mask+left pad"]
    # BLOCK_N (64) divides 128: a scalar block id per chunk (plus lengths), not one per position.
    assert aligned.get("ld_global_4B", 0) <= 4 < gathered.get("ld_global_4B", 0), (aligned,
                                                                                  gathered)
    assert aligned["registers"] < gathered["registers"]


def test_decode_grid_fills_an_h100_subprocess(sm90):
    row = next(r for r in sm90[0]["rows"]
               if r["case"] == "decode fp16 B8 32k" and r["kernel"] == "_split_kv_kernel")
    b, nkv, splits = row["grid"]
    assert (b, nkv) == (8, 8) and b * nkv * splits >= 4 * aot.H100_SMS


_CONTEXT_SCRIPT = r"""
import torch, triton, triton.language as tl
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from torchair.ops.toolchain import triton_aot as aot
from torchair.ops.toolchain.triton_utils import COMPILE_ONLY_SMS, launch_mode, sm_count

@triton.jit
def copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)

@triton.jit
def broken(X, BLOCK: tl.constexpr):
    tl.store(X + tl.arange(0, BLOCK), 1.0)  # BLOCK = 3: not a power of two

cpu = torch.device("cpu")
try:
    launch_mode(cpu, "my kernel")
    raise SystemExit("a CPU tensor outside compile_only must be refused")
except RuntimeError as e:
    assert "my kernel got a tensor on cpu" in str(e) and "TRITON_INTERPRET=1" in str(e), e

run, active = JITFunction.run, driver._active
x = torch.empty(1024, device="meta")
with aot.compile_only(arch=90, sm_count=7) as launches:
    assert launch_mode(cpu, "my kernel") is False and sm_count(cpu) == 7
    copy[(2,)](x, torch.empty_like(x), 1024, BLOCK=512)
    copy[(2,)](x, torch.empty_like(x), 1000, BLOCK=512)
aligned, ragged = launches
assert aligned.name == "copy" and aligned.grid == (2,), aligned
usage = aligned.usage()
assert usage["registers"] > 0 and usage["local_bytes"] == 0, usage
# Triton's own specialization: n = 1024 is known divisible by 16, so the masked loads of 512
# floats over 128 threads are 16-byte vectors; n = 1000 is not, so they stay 4-byte loads.
assert usage.get("ld_global_16B", 0) >= 1 and "ld_global_4B" not in usage, usage
assert ragged.usage().get("ld_global_4B", 0) >= 1, ragged.usage()
assert ".target sm_90" in aligned.ptx and aligned.cubin[:4] == b"\x7fELF"
try:
    with aot.compile_only():
        broken[(1,)](x, BLOCK=3)
    raise SystemExit("a kernel that does not compile must raise")
except triton.compiler.errors.CompilationError as e:
    assert "power of 2" in str(e), e
assert JITFunction.run is run and driver._active is active and COMPILE_ONLY_SMS.get() is None
print("ok")
"""


def test_compile_only_records_usage_raises_and_restores_subprocess(tmp_path):
    script = tmp_path / "context.py"  # @triton.jit needs its kernels' source in a file
    script.write_text(_CONTEXT_SCRIPT)
    assert _run([str(script)], interpret=False).strip().endswith("ok")


def test_compile_only_refuses_an_interpreted_process_subprocess():
    code = ("from torchair.ops.toolchain import triton_aot as aot\n"
            "try:\n"
            "    with aot.compile_only():\n"
            "        pass\n"
            "except RuntimeError as e:\n"
            "    assert 'TRITON_INTERPRET=1' in str(e), e\n"
            "    print('refused')\n")
    assert _run(["-c", code], interpret=True).strip() == "refused"


def test_unknown_case_is_named_subprocess():
    with pytest.raises(AssertionError, match=r"unknown case\(s\) \['no such case'\]"):
        _run(["-m", "torchair.ops.toolchain.triton_aot", "no such case"], interpret=False)


def test_global_load_widths_reads_ptx_forms():
    ptx = "\n".join([
        "\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];",
        "\t@%p1 ld.global.nc.v2.f32 { %f1, %f2 }, [ %rd2 + 0 ];",
        "\tld.global.L1::evict_last.b16 { %rs1 }, [ %rd3 + 0 ];",
        "\tld.global.b32 { %r5 }, [ %rd4 + 0 ];",
        "\tcp.async.cg.shared.global [ %r88 + 0 ], [ %rd31 + 0 ], 0x10, %r27;",
        "\tcp.async.ca.shared.global [ %r89 + 0 ], [ %rd32 + 0 ], 4;",
        "\tst.global.v4.b32 [ %rd5 + 0 ], { %r1, %r2, %r3, %r4 };",
        "\tld.shared.v4.b32 { %r1, %r2, %r3, %r4 }, [ %r9 + 0 ];",
    ])
    assert aot.global_load_widths(ptx) == {16: 2, 8: 1, 2: 1, 4: 2}
