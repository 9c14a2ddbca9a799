"""The roofline columns of bench.bench_decode_step (floor, x floor) and the per-op profile
table, from one tiny run of the benchmark (FX engine only). Nothing about speed is asserted: only
that the fields exist, the floor is positive and each multiple is its time over the floor."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from bench import _decode_variants as V, _profile as P, bench_decode_step as bench
from torchair.demo.roofline import GemvFloor, floor_us, kv_read_bytes, x_floor
from torchair.ops.matmul import cpu as _mm


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    out = tmp_path_factory.mktemp("roofline") / "decode_step.json"
    threads = torch.get_num_threads()
    try:  # one thread: fast on a busy machine; --warm-cache: leave Inductor's config alone
        code = bench.main(["--quick", "--variants", "torchair-fx", "--batch", "1", "3",
                           "--steps", "2", "--rounds", "2", "--profile-steps", "2",
                           "--warm-cache", "--threads", "1", "--decompose", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return json.loads(out.read_text())


def test_floor_fields_and_multiples(payload):
    assert [r["batch"] for r in payload["results"]] == [1, 3]
    for res in payload["results"]:
        floor = res["floor"]
        assert floor["floor_us"] > 0 and floor["gemv_us"]["median"] > 0
        assert floor["read_bandwidth_gb_per_s"] > 0 and floor["kv_bytes_per_step"] > 0
        assert floor["weight_bytes"] > 0 and "torch.sum" in floor["read_bandwidth"]["method"]
        assert math.isclose(floor["floor_us"], floor["gemv_us"]["median"] + floor["kv_us"])
        assert math.isclose(floor["kv_us"], floor["kv_bytes_per_step"]
                            / floor["read_bandwidth_gb_per_s"] / 1e3)
        assert set(res["variants"]) == {"eager", "torchair-fx"}  # the floor is no variant
        for v in res["variants"].values():
            assert math.isclose(v["x_floor"], v["per_step_us"]["median"] / floor["floor_us"])
            assert v["x_floor_paired"]["n_rounds"] == 2 and v["x_floor_paired"]["median"] > 0


def test_dynamo_floor_bounds_every_torch_compile_variant(payload):
    """torchair-fx runs through torch.compile, so the run times the floor-gemv+dynamo row: the
    GEMVs then Dynamo with a backend that does nothing. Minus the GEMV row it is Dynamo's
    per-call work; the floor plus that work is reported as a multiple of eager's median."""
    for res in payload["results"]:
        dyn, floor = res["dynamo_floor"], res["floor"]
        stats = dyn["gemv_plus_dynamo_us"]
        assert stats["n"] == 2 * 2 and stats["median"] > 0 and dyn["recompiles_timed"] == 0
        assert math.isclose(dyn["dynamo_us"], stats["median"] - floor["gemv_us"]["median"])
        assert math.isclose(dyn["floor_plus_dynamo_us"], floor["floor_us"] + dyn["dynamo_us"])
        eager = res["variants"]["eager"]["per_step_us"]["median"]
        assert math.isclose(dyn["floor_plus_dynamo_speedup"], eager / dyn["floor_plus_dynamo_us"])
        assert "torchair_minus_nodynamo_us" not in dyn  # torchair and nodynamo did not run
        # Dynamo passes the weights, both caches, x, pos and the lengths to the backend
        cfg = payload["config"]
        assert dyn["graph_inputs"] >= 7 * cfg["layers"] + 2 * cfg["layers"] + 2
        assert "returns its first result" in dyn["method"]


def test_decomposition_rows(payload):
    """--decompose times the attention calls alone and the GEMVs then those calls; each derived
    figure is its rows' arithmetic, and the rows are no variants."""
    for res in payload["results"]:
        dec, floor = res["decomposition"], res["floor"]
        attn, both = dec["attn_alone_us"], dec["gemv_attn_us"]
        assert attn["n"] == both["n"] == 2 * 2 and attn["median"] > 0 and both["median"] > 0
        assert math.isclose(dec["attn_read_gb_per_s"],
                            floor["kv_bytes_per_step"] / attn["median"] / 1e3)
        assert math.isclose(dec["attn_minus_kv_term_us"], attn["median"] - floor["kv_us"])
        assert math.isclose(dec["together_minus_alone_us"],
                            both["median"] - floor["gemv_us"]["median"] - attn["median"])
        fx = res["variants"]["torchair-fx"]["per_step_us"]["median"]
        assert dec["variant_minus_gemv_attn_us"] == pytest.approx({"torchair-fx": fx - both["median"]})
        assert set(res["variants"]) == {"eager", "torchair-fx"}


def test_attention_calls_compute_the_step_attention():
    """What attn-alone times is the step's attention: the launch kernel's outputs (or the op's,
    without the launch library) equal npu_incre_flash_attention's on the same caches, lengths
    and query, for every layer."""
    import torchair  # noqa: F401  (registers torch.ops.npu.*)
    from bench.model import ModelConfig, make_schedule, seeded_decoder

    cfg = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, capacity=64)
    _, init_k, init_v = seeded_decoder(cfg, 3, "cpu", torch.float32, 0)
    schedule = make_schedule(cfg, 3, 4, "cpu", torch.float32, 1)
    calls = V.AttentionCalls(cfg, init_k, init_v, schedule)
    for step in schedule:
        outs = calls(step)
        assert len(outs) == cfg.layers
        for q, k, v, out in zip(calls.queries, init_k, init_v, outs):
            ref = torch.ops.npu.npu_incre_flash_attention(
                q, k, v, actual_seq_lengths=step.lens, num_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads, input_layout="BSH",
                scale_value=cfg.head_dim ** -0.5)
            torch.testing.assert_close(out.reshape(ref.shape), ref)


def test_kv_bytes_follow_the_lengths(payload):
    """Every step reads at least 2 positions per sequence (lengths start at >= 2)."""
    cfg = payload["config"]
    per_position = 2 * cfg["layers"] * cfg["kv_heads"] * cfg["head_dim"] * 4  # float32
    for res in payload["results"]:
        assert res["floor"]["kv_bytes_per_step"] >= 2 * res["batch"] * per_position


def test_profile_table_in_json(payload):
    for res in payload["results"]:
        prof = res["profile"]
        assert prof["variant"] == "torchair-fx" and prof["steps"] == 2
        ops = prof["ops"]
        assert ops and all(r["calls_per_step"] > 0 for r in ops)
        per_step = [r["self_cpu_us_per_step"] for r in ops]
        assert per_step == sorted(per_step, reverse=True)
        for r in ops:
            assert math.isclose(r["self_cpu_us_per_step"],
                                r["self_cpu_us_per_call"] * r["calls_per_step"], rel_tol=1e-9)
        # the FX engine's unit runs eager's kernels: its products stay ATen's, at every batch
        # (only Inductor-engine units bind few-row products to torchair_native::gemv)
        names = {r["name"] for r in ops}
        assert "aten::mm" in names and "torchair_native::gemv" not in names
        assert math.isclose(sum(r["self_cpu_share"] for r in ops), 1.0, rel_tol=1e-6)


def test_op_table_and_formatting_from_a_small_profile():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    prof = P.profile_steps(lambda i: (a @ b).relu_(), range(4))
    rows = P.op_table(prof, 4)
    by_name = {r["name"]: r for r in rows}
    assert by_name["aten::mm"]["calls_per_step"] == 1
    assert by_name["aten::relu_"]["calls_per_step"] == 1
    text = P.format_op_table(rows, top=1)
    assert text.splitlines()[0].startswith("op") and "more ops" in text
    md = P.op_table_markdown(rows, top=None)
    assert md.startswith("| op |") and "`aten::mm`" in md
    with pytest.raises(ValueError):
        P.op_table(prof, 0)


def test_roofline_helpers(monkeypatch):
    assert kv_read_bytes([3, 5], kv_hidden=4, layers=2, itemsize=4) == 2 * 2 * 4 * 4 * 8
    assert floor_us(10.0, 2e4, 1.0) == pytest.approx(30.0)  # 2e4 B at 1 GB/s = 20 us
    assert x_floor(50.0, 25.0) == 2.0 and x_floor(None, 1.0) is None and x_floor(1.0, 0) is None
    lin = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 4))
    g = GemvFloor.of_module(lin, batch=2)
    assert g.weight_bytes == (24 + 24) * 4 and sorted(g.inputs) == [4, 6]
    assert g.weights[0] is lin[0].weight  # the model's own tensors
    g()
    # each product is the one a CPU static unit runs: the few-row kernel where units bind it
    fast = "torchair_native::gemv" if _mm.binds_rows(_mm.MIN_ROWS) else "F.linear"
    bound = GemvFloor.of_module(lin, batch=_mm.MIN_ROWS)
    assert [name for name, _ in bound.calls] == [fast, fast]
    assert f"2 {fast} calls" in bound.describe()
    bound()
    assert [name for name, _ in GemvFloor.of_module(lin, _mm.MAX_ROWS + 1).calls] == \
        ["F.linear"] * 2  # ATen's where units keep mm
    monkeypatch.setattr(_mm, "MIN_ROWS", 4)  # as on an Intel CPU with MKL
    assert [name for name, _ in GemvFloor.of_module(lin, 3).calls] == ["F.linear"] * 2
    monkeypatch.undo()
    wide = GemvFloor.of_module(lin.to(torch.float64), batch=_mm.MIN_ROWS)
    assert [name for name, _ in wide.calls] == ["F.linear", "F.linear"]
    wide()


def test_torchair_mm_variant_builds_with_the_switch_off(monkeypatch):
    """``torchair-mm``: the compiling (first) call sees TORCHAIR_SMALL_GEMM=0, later calls and
    the rest of the process see the environment as it was."""
    monkeypatch.setenv(_mm.ENV_SWITCH, "1")
    seen = []

    def compiled(x):
        seen.append(os.environ.get(_mm.ENV_SWITCH))
        if x == "boom":
            raise RuntimeError(x)
        return x

    call = V.built_with(compiled, {_mm.ENV_SWITCH: "0"})
    assert call(1) == 1 and call(2) == 2
    assert seen == ["0", "1"] and os.environ[_mm.ENV_SWITCH] == "1"
    monkeypatch.delenv(_mm.ENV_SWITCH)
    failing = V.built_with(compiled, {_mm.ENV_SWITCH: "0"})
    with pytest.raises(RuntimeError):
        failing("boom")
    assert _mm.ENV_SWITCH not in os.environ  # put back even when the first call raised
    assert "torchair-mm" in bench.ALL_VARIANTS
    assert "torchair-mm" in bench.parse_args(["--device", "cpu"]).variants


def test_torchair_ungrouped_is_torchair_cache_built_with_the_groups_off(monkeypatch):
    """``torchair-ungrouped``: ``torchair-cache`` (through ``cache_compile``) whose compiling call
    sees TORCHAIR_GEMV_GROUPS=0; ``torchair-cache``'s sees the environment as it is. (What the
    switch does to a unit: tests/ops/test_gemv_cat.py.)"""
    import torchair
    from bench.model import DecoderStep, ModelConfig, make_schedule

    seen = []

    def fake_cache_compile(func, **_):
        return lambda *args: seen.append(os.environ.get(_mm.GROUP_SWITCH)) or args[0]

    monkeypatch.setattr(torchair.inference, "cache_compile", fake_cache_compile)
    monkeypatch.delenv(_mm.GROUP_SWITCH, raising=False)
    cfg = ModelConfig(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=128, capacity=64)
    model = DecoderStep(cfg).eval()
    init = [torch.zeros(2, cfg.capacity, cfg.kv_hidden)]
    step = make_schedule(cfg, 2, 1, "cpu", torch.float32, 0)[0]
    for name in ("torchair-cache", "torchair-ungrouped", "torchair-ungrouped"):
        V.make_variant(name, model, init, init)(step)
    assert seen == [None, "0", "0"] and _mm.GROUP_SWITCH not in os.environ
    assert "torchair-ungrouped" in bench.parse_args(["--device", "cpu"]).variants
    assert "torchair-ungrouped" in V.CPU_ONLY


def test_recompile_limit_covers_every_compiled_variant_of_every_batch():
    # the default CPU run compiles 8 variants and the Dynamo floor on one code object, per batch:
    # under Dynamo's default limit (8) the floor's first call failed (fullgraph=True)
    args = bench.parse_args(["--batch", "1", "8"])
    compiled = len(args.variants)  # every variant but eager, plus the Dynamo floor
    assert compiled > torch._dynamo.config.recompile_limit
    assert bench.recompile_limit(args) >= compiled * 2
