"""Compile the Triton kernels for an NVIDIA GPU without one: a static check of the GPU code.

Triton's interpreter (how CI runs the kernels on CPU) executes the kernels' semantics but not
their GPU compilation: a tile shape ``tl.dot`` rejects on a GPU, a layout conversion the
compiler cannot do, or a kernel that runs out of registers all pass there. :func:`compile_only`
closes that gap. Inside it, a kernel wrapper called with meta tensors (shapes and dtypes only)
goes through its real launch path (the same heuristics, the same constexprs, Triton's own
argument specialization) and each launch compiles for ``sm_<arch>`` down to a cubin with the
``ptxas`` that ships with Triton, and records the result instead of running it::

    with compile_only(arch=90, sm_count=132) as launches:
        decode_attention_triton(q, k, v, lengths=lengths, scale=0.088)  # meta tensors
    for launch in launches:
        print(launch.name, launch.usage())   # registers, spills, shared memory

:func:`resource_usage` reads registers / local memory (spills) from the cubin with the bundled
``cuobjdump``; :func:`global_load_widths` counts the widths of the PTX global loads (16-byte
loads are what a memory-bound kernel wants).

It needs a process in which Triton compiles (``TRITON_INTERPRET`` unset when triton was
imported) and is not thread-safe: while active, every Triton launch in the process compiles
only. Nothing here needs or touches a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

from torchair.ops.toolchain.triton_utils import COMPILE_ONLY_SMS, HAS_TRITON, interpreted, triton

__all__ = ["CompiledLaunch", "compile_only", "global_load_widths", "resource_usage"]

H100_SMS = 132  # H100 SXM; the H200 has the same count


@dataclasses.dataclass
class CompiledLaunch:
    """One launch compiled (not run) inside :func:`compile_only`."""

    name: str
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int
    shared_bytes: int          # shared memory the launch needs (Triton's metadata)
    ptx: str
    cubin: bytes

    def usage(self) -> dict[str, int]:
        """Registers per thread and local (spill) bytes per thread from the cubin, shared
        memory from Triton, and the counts of PTX global loads by width."""
        out = dict(resource_usage(self.cubin))
        out["shared_bytes"] = self.shared_bytes
        out["num_warps"] = self.num_warps
        out["num_stages"] = self.num_stages
        out.update({f"ld_global_{w}B": n for w, n in sorted(global_load_widths(self.ptx).items())})
        return out


class _CompileOnlyDriver:
    """The three calls ``JITFunction.run`` makes of Triton's active driver, for a target with
    no device behind it."""

    def __init__(self, target) -> None:
        self._target = target
        self._device = f"torchair-aot-sm{target.arch}"  # never a real device's cache key

    def get_current_target(self):
        return self._target

    def get_current_device(self):
        return self._device

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def compile_only(arch: int = 90, sm_count: int = H100_SMS) -> Iterator[list[CompiledLaunch]]:
    """Inside, Triton launches compile for CUDA ``sm_<arch>`` (plan for ``sm_count`` SMs) and
    are recorded in the yielded list instead of running; the wrappers accept meta tensors."""
    if not HAS_TRITON:
        raise RuntimeError("compile_only needs the 'triton' package")
    if interpreted():
        raise RuntimeError("compile_only needs Triton's compiler, but this process imported "
                           "triton with TRITON_INTERPRET=1; run it in a process without it")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    launches: list[CompiledLaunch] = []
    original_run = JITFunction.run

    def compile_run(self, *args, grid, warmup, **kwargs):
        kernel = original_run(self, *args, grid=grid, warmup=True, **kwargs)
        meta = kernel.metadata
        launches.append(CompiledLaunch(
            name=self.__name__, grid=tuple(grid) if not callable(grid) else (),
            num_warps=meta.num_warps, num_stages=meta.num_stages, shared_bytes=meta.shared,
            ptx=kernel.asm["ptx"], cubin=kernel.asm["cubin"]))
        return kernel

    previous = driver._active  # reset_active() would create the real driver: no GPU here
    token = COMPILE_ONLY_SMS.set(int(sm_count))
    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", int(arch), 32)))
    JITFunction.run = compile_run
    try:
        yield launches
    finally:
        JITFunction.run = original_run
        driver._active = previous
        COMPILE_ONLY_SMS.reset(token)


def _nvidia_tool(name: str) -> str | None:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.access(path, os.X_OK) else None


_USAGE = re.compile(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)")


def resource_usage(cubin: bytes) -> dict[str, Any]:
    """``{"registers": per thread, "local_bytes": per thread (spills), "static_shared_bytes"}``
    of the one kernel in ``cubin``, read with Triton's bundled ``cuobjdump``; empty when that
    tool is missing."""
    tool = _nvidia_tool("cuobjdump")
    if tool is None:
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    m = _USAGE.search(text)
    if m is None:
        raise RuntimeError(f"cannot read the resource usage from cuobjdump's output: {text!r}")
    return {"registers": int(m.group(1)), "local_bytes": int(m.group(3)),
            "static_shared_bytes": int(m.group(2))}


_LD_GLOBAL = re.compile(r"\bld\.global(?:\.[A-Za-z0-9_:]+)*?(?:\.v(\d))?\.(?:[bsuf])(\d+)\b")
_CP_ASYNC = re.compile(r"\bcp\.async\.c[ag]\.shared\.global(?:\.[a-z0-9_:]+)*\s*\[[^]]*\],\s*"
                       r"\[[^]]*\],\s*(0x[0-9a-fA-F]+|\d+)")


def global_load_widths(ptx: str) -> dict[int, int]:
    """How many PTX global loads of each width in bytes (``ld.global`` with vector counts, and
    ``cp.async`` global -> shared copies) the kernel has."""
    widths: dict[int, int] = {}
    for vec, bits in _LD_GLOBAL.findall(ptx):
        w = int(vec or 1) * int(bits) // 8
        widths[w] = widths.get(w, 0) + 1
    for nbytes in _CP_ASYNC.findall(ptx):
        w = int(nbytes, 0)
        widths[w] = widths.get(w, 0) + 1
    return widths


# ----------------------------------------------------------------------------------------------
# The catalog: every Triton kernel of torchair.ops at serving shapes (Llama-like GQA 8:1, head
# dim 128, hidden 4096), in the constexpr variants the ops launch. Each case calls the real
# wrapper with meta tensors.
# ----------------------------------------------------------------------------------------------

def _meta(*shape, dtype):
    import torch
    return torch.empty(*shape, dtype=dtype, device="meta")


def _decode_case(*, batch=8, nkv=8, group=8, dim=128, seq=32768, dtype="float16",
                 kv_dtype=None, block_size=0, mask=False, left_pad=False, antiquant=False):
    import torch

    from torchair.ops.attention.triton.decode import decode_attention_triton
    dt = getattr(torch, dtype)
    kvt = getattr(torch, kv_dtype) if kv_dtype else dt
    q = _meta(batch, nkv * group, dim, dtype=dt)
    table = None
    if block_size:
        blocks = seq // block_size
        k = _meta(batch * blocks, nkv, block_size, dim, dtype=kvt)
        table = _meta(batch, blocks, dtype=torch.int32)
    else:
        k = _meta(batch, nkv, seq, dim, dtype=kvt)
    per_channel = _meta(nkv, dim, dtype=torch.float32) if antiquant else None
    decode_attention_triton(
        q, k, torch.empty_like(k), lengths=_meta(batch, dtype=torch.int32), scale=dim ** -0.5,
        kv_start=_meta(batch, dtype=torch.int64) if left_pad else None, block_table=table,
        mask=_meta(batch, seq, dtype=torch.bool) if mask else None,
        k_scale=per_channel, k_offset=per_channel, v_scale=per_channel, v_offset=per_channel)


def _norm_case(kind: str, *, rows=16, width=4096, dtype="bfloat16"):
    import torch

    from torchair.ops.norm import triton as nt
    dt = getattr(torch, dtype)
    x = _meta(rows, width, dtype=dt)
    gamma = _meta(width, dtype=dt)
    if kind == "rms_norm":
        nt.rms_norm_triton(x, gamma, 1e-6)
    elif kind == "add_rms_norm_f32":
        nt.add_rms_norm_triton(x, torch.empty_like(x), gamma, 1e-6, want_f32=True)
    elif kind == "dynamic_quant_grouped":
        nt.dynamic_quant_triton(x, _meta(8, width, dtype=dt), _meta(8, dtype=torch.int64))
    elif kind == "add_rms_norm_dynamic_quant":
        nt.add_rms_norm_dynamic_quant_triton(
            x, torch.empty_like(x), gamma, smooth_scale1=gamma, smooth_scale2=gamma, beta=gamma,
            epsilon=1e-6, want1=True, want2=True)
    else:
        raise ValueError(f"unknown norm case {kind!r}")


def _quant_matmul_case(*, m=16, n=4096, k=4096, out="bfloat16", pertoken=True, offset=False,
                       float_bias=True):
    import torch

    from torchair.ops.quant.plans import QuantMatmulPlan
    from torchair.ops.quant.triton import quant_matmul_triton
    f32 = torch.float32
    plan = QuantMatmulPlan(
        out_dtype=getattr(torch, out), scale=_meta(n, dtype=f32),
        offset=_meta(n, dtype=f32) if offset else None,
        pertoken=_meta(m, dtype=f32) if pertoken else None,
        float_bias=_meta(n, dtype=f32) if float_bias else None)
    quant_matmul_triton(_meta(m, k, dtype=torch.int8), _meta(k, n, dtype=torch.int8), plan)


def _swiglu_quant_case(*, tokens=16, hidden=4096, dynamic=True, groups=1):
    import torch

    from torchair.ops.quant.plans import SwigluQuantPlan
    from torchair.ops.quant.triton import dequant_swiglu_quant_triton
    f32 = torch.float32
    plan = SwigluQuantPlan(
        x=_meta(tokens, 2 * hidden, dtype=torch.int32), lead_shape=(tokens,), dynamic=dynamic,
        activate_left=False, num_groups=groups, weight_scale=_meta(groups, 2 * hidden, dtype=f32),
        act_scale=_meta(tokens, dtype=f32),
        quant_scale=_meta(groups, hidden, dtype=f32) if dynamic else _meta(1, 1, dtype=f32),
        quant_offset=None if dynamic else _meta(1, 1, dtype=f32),
        row_group=_meta(tokens, dtype=torch.int64) if groups > 1 else None)
    dequant_swiglu_quant_triton(plan)


CASES: dict[str, Any] = {
    "decode fp16 B8 32k": lambda: _decode_case(),
    "decode bf16 B8 32k": lambda: _decode_case(dtype="bfloat16"),
    "decode bf16 B1 512": lambda: _decode_case(batch=1, seq=512, dtype="bfloat16"),
    "decode fp16 paged bs128 32k": lambda: _decode_case(block_size=128),
    "decode bf16 paged bs16 mask+left pad": lambda: _decode_case(
        dtype="bfloat16", seq=4096, block_size=16, mask=True, left_pad=True),
    "decode fp16 int8 KV antiquant": lambda: _decode_case(kv_dtype="int8", antiquant=True),
    "decode fp32 G1 D64": lambda: _decode_case(dtype="float32", group=1, dim=64, seq=4096),
    "decode bf16 MQA G64": lambda: _decode_case(dtype="bfloat16", nkv=1, group=64, seq=4096),
    "decode fp16 D256": lambda: _decode_case(dim=256, seq=4096),
    "rms_norm bf16 4096": lambda: _norm_case("rms_norm"),
    "add_rms_norm fp16 8192 +f32": lambda: _norm_case("add_rms_norm_f32", width=8192,
                                                       dtype="float16"),
    "dynamic_quant grouped bf16": lambda: _norm_case("dynamic_quant_grouped"),
    "add_rms_norm_dynamic_quant bf16": lambda: _norm_case("add_rms_norm_dynamic_quant"),
    "quant_matmul M16 bf16 pertoken": lambda: _quant_matmul_case(),
    "quant_matmul M256 int8 offset": lambda: _quant_matmul_case(
        m=256, out="int8", pertoken=False, offset=True, float_bias=False),
    "dequant_swiglu_quant dynamic": lambda: _swiglu_quant_case(),
    "dequant_swiglu_quant static grouped": lambda: _swiglu_quant_case(dynamic=False, groups=4),
}


def compile_catalog(names=None, *, arch: int = 90, sm_count: int = H100_SMS
                    ) -> list[dict[str, Any]]:
    """Compile the catalog's cases (all, or ``names``) for ``sm_<arch>``: one row per launch
    with the case, kernel, grid, launch options and :meth:`CompiledLaunch.usage`."""
    rows = []
    for name in names if names is not None else CASES:
        with compile_only(arch=arch, sm_count=sm_count) as launches:
            CASES[name]()
        if not launches:
            raise RuntimeError(f"case {name!r} launched no Triton kernel")
        for launch in launches:
            rows.append({"case": name, "kernel": launch.name, "grid": list(launch.grid),
                         **launch.usage()})
    return rows


def main(argv=None) -> int:
    import argparse
    import json
    import time
    parser = argparse.ArgumentParser(
        prog="python -m torchair.ops.toolchain.triton_aot",
        description="Compile torchair's Triton kernels for an NVIDIA GPU (no GPU needed) and "
                    "print registers, spills, shared memory and global load widths per launch.")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100)")
    parser.add_argument("--sm-count", type=int, default=H100_SMS,
                        help="SMs the launch heuristics plan for (default: %(default)s, H100)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("cases", nargs="*", help=f"case names (default: all): {list(CASES)}")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    t0 = time.perf_counter()
    rows = compile_catalog(args.cases or None, arch=args.arch, sm_count=args.sm_count)
    cols = ["case", "kernel", "grid", "num_warps", "num_stages", "registers", "local_bytes",
            "shared_bytes"]
    print(" | ".join(cols + ["global loads (bytes: count)"]))
    for r in rows:
        loads = ", ".join(f"{k[10:-1]}: {v}" for k, v in r.items() if k.startswith("ld_global_"))
        print(" | ".join(str(r.get(c, "?")) for c in cols) + " | " + loads)
    print(f"{len(rows)} launches compiled for sm_{args.arch} in {time.perf_counter() - t0:.1f} s")
    if args.json:
        import triton as _triton
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "sm_count": args.sm_count,
                       "triton": _triton.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
