"""What one eager ``npu_incre_flash_attention`` decode call costs on CPU, and where it goes.

Variants, timed side by side in interleaved rounds (``_harness``), same data (B, KV length, BSH,
heads / kv heads, D from the flags; float32):

* ``kernel``: the native kernel alone through ctypes, every argument prepared beforehand (the
  floor of a call: what a launch unit with nothing but pointers to move would pay);
* ``ctypes-noop``: the same ctypes call refused by the kernel at once (``G = 0``): what ctypes
  itself costs inside the ``kernel`` row, so the kernel's own time is ``kernel - ctypes-noop``;
* ``launch``: ``torch.ops.torchair_native.ifa_decode`` (the C++ launch kernel through the
  dispatcher, int64 lengths tensor): exactly the call a CPU static unit's generated code makes;
* ``fast``: ``torchair.ops.attention.ifa_fast.call`` (the bound fast path, no dispatcher);
* ``op``: ``torch.ops.npu.npu_incre_flash_attention`` (dispatcher + fast path), what scripts call;
* ``twin``: the tensor twin with int64 lengths (what a static unit calls);
* ``general``: the op with the fast path off (validation and planning per call);
* ``sdpa``: ``F.scaled_dot_product_attention`` on the same window (views, GQA), the target.

Prints each variant's median per call, its multiple of ``kernel`` and its cost above the
kernel's own time (``kernel - ctypes-noop``); saves JSON under
``bench/results/ifa_call_<machine>.json``.

    python -m bench.bench_ifa_call [--batch 1] [--kv 512] [--len 500] [--rounds 15] [--calls 200]
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time

import torch

import torchair  # noqa: F401  (registers the ops)
from bench import _harness
from torchair.ops.attention import ifa_fast as _ifa_fast
from torchair.ops.attention.cpu import launch_fakes as _fakes, launch_library as _launch, native as _decode_native


def _variants(args) -> dict:
    b, n, nkv, d, s, length = args.batch, args.heads, args.kv_heads, args.dim, args.kv, args.len
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 1, n * d, generator=g)
    k = torch.randn(b, s, nkv * d, generator=g)
    v = torch.randn(b, s, nkv * d, generator=g)
    lengths = [length] * b
    kw = dict(num_heads=n, num_key_value_heads=nkv, scale_value=d ** -0.5, input_layout="BSH")
    op = torch.ops.npu.npu_incre_flash_attention
    twin = torch.ops.npu.npu_incre_flash_attention_tensor
    length_t = torch.tensor(lengths)

    fn = _decode_native.kernel()
    group, rows = n // nkv, b * nkv
    threads, splits = _decode_native.work_split(b, nkv, length)
    out, out_l = torch.empty(rows, group, d), torch.empty(rows, group)
    scratch = torch.empty(rows * splits * group * (d + 2))
    lo, hi = (ctypes.c_int64 * b)(), (ctypes.c_int64 * b)(*lengths)
    err = (ctypes.c_int64 * 3)()
    canon = k.view(b, s, nkv, d).transpose(1, 2)
    base, items = scratch.data_ptr(), rows * splits
    kernel_args = (q.data_ptr(), None, k.data_ptr(), v.data_ptr(), 0, *canon.stride()[:3], None,
                   0, 0, 1, 0, ctypes.addressof(lo), ctypes.addressof(hi), None, 0, b, nkv,
                   group, d, splits, threads, base, base + 4 * items * group,
                   base + 8 * items * group, out.data_ptr(), out_l.data_ptr(), d ** -0.5, 0,
                   ctypes.addressof(err))

    qs = q.view(b, 1, n, d).transpose(1, 2)
    ks = canon[:, :, :length]
    vs = v.view(b, s, nkv, d).transpose(1, 2)[:, :, :length]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def general(_):
        with _ifa_fast.disabled():
            return op(q, k, v, actual_seq_lengths=lengths, **kw)

    def repeat(call):
        def run(_):
            for _ in range(args.calls):
                call()
        return run

    reference = op(q, k, v, actual_seq_lengths=lengths, **kw)
    torch.testing.assert_close(general(0), reference)  # the variants compute the same thing
    torch.testing.assert_close(sdpa(qs, ks, vs, enable_gqa=True).transpose(1, 2).reshape(q.shape),
                               reference, atol=1e-5, rtol=1e-5)
    keep = (out, out_l, scratch, lo, hi, err)  # kernel_args holds raw pointers into these

    def kernel():
        assert keep
        return fn(*kernel_args)

    refused = list(kernel_args)
    refused[19] = 0  # G = 0: the kernel returns -1 before touching anything
    assert fn(*refused) == -1
    launch = _fakes.ifa_decode() if _launch.available() else None
    launch_args = (q, k, v, length_t, None, None, n, nkv, _launch.LAYOUTS["BSH"], 0, d ** -0.5)
    if launch is not None:
        torch.testing.assert_close(launch(*launch_args), reference, atol=0, rtol=0)

    variants = {
        "kernel": repeat(kernel),
        "ctypes-noop": repeat(lambda: fn(*refused)),
        "launch": repeat(lambda: launch(*launch_args)),
        "fast": repeat(lambda: _ifa_fast.call(q, k, v, lengths, None, n, d ** -0.5, "BSH", nkv,
                                              0)),
        "op": repeat(lambda: op(q, k, v, actual_seq_lengths=lengths, **kw)),
        "twin": repeat(lambda: twin(q, k, v, actual_seq_lengths=length_t, **kw)),
        "general": repeat(lambda: general(0)),
        "sdpa": repeat(lambda: sdpa(qs, ks, vs, enable_gqa=True)),
    }
    if launch is None:
        print("the C++ launch kernel is not available (no C++ compiler?): no launch row")
        del variants["launch"]
    return variants


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--kv", type=int, default=512, help="KV cache length S")
    parser.add_argument("--len", type=int, default=500, help="attended length per sequence")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed step")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not _decode_native.available():
        print("the native kernel is not available (no C compiler?): nothing to measure")
        return 1
    info = _harness.machine_info("cpu")
    _harness.print_machine(info)
    start = time.time()
    variants = _variants(args)
    for fn in variants.values():  # warm up (binds the fast path's signature)
        fn(0)
    rounds = _harness.interleaved_rounds(variants, lambda r: [0], args.rounds,
                                         _harness.synchronizer("cpu"))
    per_call = {name: _harness.summarize(r, scale=1e6 / args.calls)
                for name, r in rounds.items()}
    floor = per_call["kernel"]["median"]
    own = floor - per_call["ctypes-noop"]["median"]  # the kernel's own time
    rows = [[name, round(s["median"], 1), round(s["p10"], 1), round(s["p90"], 1),
             round(s["median"] / floor, 2), round(s["median"] - own, 1)]
            for name, s in per_call.items()]
    print(_harness.format_table(["variant", "us/call", "p10", "p90", "x kernel",
                                 "us above kernel's own time"], rows))
    print(f"kernel's own time = kernel - ctypes-noop = {own:.1f} us")
    payload = {"benchmark": "ifa_call", "machine": info, "args": vars(args),
               "command": _harness.command_line(), "per_call_us": per_call,
               "kernel_own_us": own,
               "total_runtime_s": time.time() - start}
    _harness.save_results("ifa_call", _harness.machine_tag(info), payload, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
