"""Dynamic gears (seed 001 part 1): one Dynamo trace, one static launch unit per gear, clear
errors for every misuse, and gears combined with tiling sink, mark_static, captures and dumps."""
import pathlib
import sys

import pytest
import torch
import torch._dynamo.testing

import torchair
from torchair.inference import get_dim_gears, set_dim_gears
from torchair.inference.gears import GearDim, merge_gears
from torchair.runtime.units import capture_mode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from four_paths import CAPACITY, HEAD_DIM, HIDDEN, KV_HEADS, DecodeStep  # noqa: E402


def _backend(policy="zip", tiling=False, dump=None, inductor=False):
    config = torchair.CompilerConfig()
    config.inference_config.dynamic_gears_merge_policy = policy
    config.debug.run_eagerly = not inductor
    config.experimental_config.tiling_schedule_optimize = tiling
    if dump is not None:
        config.debug.graph_dump.type, config.debug.graph_dump.path = dump[0], str(dump[1])
    return torch._dynamo.testing.CompileCounterWithBackend(
        torchair.get_npu_backend(compiler_config=config))


class Add(torch.nn.Module):
    def forward(self, x1, x2):
        return x1 + x2


@pytest.mark.parametrize("inductor", [False, pytest.param(True, marks=pytest.mark.inductor)],
                         ids=["fx", "inductor"])
def test_seed_example_zip(inductor):
    """Seed 001's example as written (on CPU): (2,2)(2,2) then (4,2)(4,2), one trace."""
    counter = _backend("zip", inductor=inductor)
    model = torch.compile(Add(), fullgraph=True, backend=counter)
    input1, input2 = torch.ones(2, 2), torch.ones(2, 2)
    set_dim_gears(input1, dim_gears={0: [2, 4]})
    set_dim_gears(input2, dim_gears={0: [2, 4]})
    assert torch.equal(model(input1, input2), input1 + input2)
    input1, input2 = torch.ones(4, 2), torch.ones(4, 2) * 3
    assert torch.equal(model(input1, input2), input1 + input2)
    assert counter.frame_count == 1
    report = torchair.graph_reports()[-1]
    assert [g["gear"] for g in report.gears] == ["L_x1_[0]=2, L_x2_[0]=2",
                                                 "L_x1_[0]=4, L_x2_[0]=4"]
    assert all(g["built"] for g in report.gears) and report.build_static
    assert "gears: 2 (2 built)" in str(report)


class Cat(torch.nn.Module):
    def forward(self, x1, x2):
        return torch.cat([x1 * 2, x2], dim=0).sum(0, keepdim=True) + x1[:1]


def test_product_policy_runs_all_four_combinations_with_one_trace():
    counter = _backend("product")
    model = torch.compile(Cat(), fullgraph=True, backend=counter)
    first = [torch.randn(2, 3), torch.randn(2, 3)]
    set_dim_gears(first[0], {0: [2, 4]})
    set_dim_gears(first[1], {0: [2, 4]})
    for n1, n2 in [(2, 2), (2, 4), (4, 2), (4, 4), (2, 4)]:
        x1, x2 = (first if (n1, n2) == (2, 2) else [torch.randn(n1, 3), torch.randn(n2, 3)])
        torch.testing.assert_close(model(x1, x2), Cat()(x1, x2))
    assert counter.frame_count == 1
    report = torchair.graph_reports()[-1]
    assert len(report.gears) == 4 and all(g["built"] for g in report.gears)


def test_product_combination_the_model_cannot_compute_fails_as_in_eager():
    """x1 + x2 needs equal batch sizes: Dynamo guarded that when it traced, so (2, 4) is not a
    silent run of another gear but the same error eager PyTorch gives."""
    model = torch.compile(Add(), fullgraph=True, backend=_backend("product"))
    x1, x2 = torch.ones(2, 2), torch.ones(2, 2)
    set_dim_gears(x1, {0: [2, 4]})
    set_dim_gears(x2, {0: [2, 4]})
    model(x1, x2)
    with pytest.raises(Exception, match="must match the size"):
        Add()(torch.ones(2, 2), torch.ones(4, 2))
    with pytest.raises(Exception, match="must match the size"):
        model(torch.ones(2, 2), torch.ones(4, 2))


def test_batch_gear_one_needs_no_second_trace():
    counter = _backend("zip")
    model = torch.compile(torch.nn.Linear(3, 5), fullgraph=True, backend=counter)
    x = torch.randn(1, 3)
    set_dim_gears(x, {0: [1, 2, 4, 8]})
    with torch.no_grad():
        for b in (1, 2, 4, 8, 1, 8):
            x = x if b == 1 and counter.frame_count == 0 else torch.randn(b, 3)
            torch.testing.assert_close(model(x), model._orig_mod(x))
    assert counter.frame_count == 1


def test_shape_outside_the_gears_names_input_dim_value_and_gears():
    model = torch.compile(Add(), fullgraph=True, backend=_backend())
    x1, x2 = torch.ones(2, 2), torch.ones(2, 2)
    set_dim_gears(x1, {0: [2, 4]})
    set_dim_gears(x2, {0: [2, 4]})
    model(x1, x2)
    with pytest.raises(ValueError, match=r"input 1 \(`L_x1_`\) dim 0 has size 3, which is not one "
                                         r"of its gears \[2, 4\]"):
        model(torch.ones(3, 2), torch.ones(3, 2))


def test_sizes_allowed_alone_but_not_together_under_zip():
    model = torch.compile(Cat(), fullgraph=True, backend=_backend("zip"))
    x1, x2 = torch.ones(2, 2), torch.ones(2, 2)
    set_dim_gears(x1, {0: [2, 4]})
    set_dim_gears(x2, {0: [2, 4]})
    model(x1, x2)
    with pytest.raises(ValueError, match=r"\(L_x1_\[0\]=2, L_x2_\[0\]=4\) are each allowed but "
                                         r"not together under the 'zip' merge policy; allowed: "
                                         r"\(L_x1_\[0\]=2, L_x2_\[0\]=2\); \(L_x1_\[0\]=4"):
        model(torch.ones(2, 2), torch.ones(4, 2))


# ---- set_dim_gears validation -------------------------------------------------------------

# TorchAir's texts (inference/_gear_utils.py), checked in TorchAir's order
@pytest.mark.parametrize("tensor, dim_gears, message", [
    ([1, 2], {0: [2, 4]}, "t must be a torch.Tensor, but got <class 'list'>"),
    (None, [2, 4], r"dim_gears must be a non-empty dict \{dim: \[sizes\]\}"),
    (None, {}, "dim_gears must be a non-empty dict"),
    (None, {"0": [2, 4]}, "Dim index in dim_gears must be an integer, but got <class 'str'>."),
    (None, {True: [2, 4]}, "Dim index in dim_gears must be an integer, but got <class 'bool'>."),
    (None, {2: [2, 4]}, r"Dim index in dim_gears must be in range \[0, 1\], but got 2."),
    (None, {-1: [2, 4]}, r"Dim index in dim_gears must be in range \[0, 1\], but got -1."),
    (None, {0: 4}, "Gears for dim index 0 in dim_gears must be a list or tuple, but got "
                   "<class 'int'>."),
    (None, {0: [2, 2.5]}, "Element at index 1 of value for dim index 0 in dim_gears must be an "
                          "integer, but got <class 'float'>."),
    (None, {0: [2]}, r"Length of gears for dim index 0 in dim_gears must be in range \[2, 100\], "
                     r"but got 1."),
    (None, {0: list(range(1, 102))}, "must be in range \\[2, 100\\], but got 101."),
    (None, {0: [2, 0]}, r"^Gear value at index 1 for dim index 0 must not be 0, but got 0.$"),
    (None, {0: [0]}, r"^Gear value at index 0 for dim index 0 must not be 0"),  # before length
    (None, {0: [2, -4]}, r"the gears of dim index 0 must be positive; got -4 in \[2, -4\]"),
])
def test_set_dim_gears_rejects(tensor, dim_gears, message):
    tensor = torch.ones(2, 3) if tensor is None else tensor
    with pytest.raises(AssertionError, match=message):
        set_dim_gears(tensor, dim_gears)


def test_set_dim_gears_takes_torchair_parameter_names_and_repeated_sizes():
    x = torch.ones(2, 3)
    set_dim_gears(t=x, dim_gears={0: [2, 4, 2]})  # a repeated size is accepted, as in TorchAir
    assert get_dim_gears(x) == {0: (2, 4, 2)}


def test_setting_other_gears_twice_is_an_error_the_same_is_not():
    x = torch.ones(2, 3)
    set_dim_gears(x, {0: [2, 4]})
    set_dim_gears(x, {0: (2, 4)})
    assert get_dim_gears(x) == {0: (2, 4)}
    with pytest.raises(AssertionError, match="already has set dim gears, and it is not supported "
                                             "to set it again."):
        set_dim_gears(x, {0: [2, 8]})


def test_repeated_combinations_are_dropped_first_seen_order_kept():
    assert merge_gears(_dims([2, 4, 2], [8, 16, 8]), "zip").gears == ((2, 8), (4, 16))
    assert merge_gears(_dims([2, 4, 2], [8, 16, 32]), "zip").gears == ((2, 8), (4, 16), (2, 32))
    assert merge_gears(_dims([2, 2, 4], [3, 3]), "product").gears == ((2, 3), (4, 3))


def _dims(*sizes):
    return [GearDim(i, f"x{i}", 0, tuple(s)) for i, s in enumerate(sizes)]


def test_merge_policies():
    assert merge_gears(_dims([2, 4], [3, 5]), "zip").gears == ((2, 3), (4, 5))
    assert merge_gears(_dims([2, 4], [3, 5]), "product").gears == ((2, 3), (2, 5), (4, 3), (4, 5))
    with pytest.raises(AssertionError, match=r"^when dynamic_gears_merge_policy is zip, input "
                                             r"gears len must same\. .* input 0 \(`x0`\) dim 0 "
                                             r"has 2 \[2, 4\], input 1 \(`x1`\) dim 0 has 3"):
        merge_gears(_dims([2, 4], [1, 2, 3]), "zip")
    with pytest.raises(AssertionError, match=r"^The total number of gears set cannot exceed 100, "
                                             r"and the current number of gears is: 121 \('product' "
                                             r"of 11 x 11 gears\)"):
        merge_gears(_dims(range(1, 12), range(1, 12)), "product")
    # counted after repeated combinations are dropped, as TorchAir counts them
    assert len(merge_gears(_dims(list(range(1, 11)) * 2, range(1, 11)), "product").gears) == 100
    with pytest.raises(AssertionError, match="current number of gears is: 10000000000 "):
        merge_gears(_dims(*[range(1, 101)] * 5), "product")  # counted, never built
    with pytest.raises(ValueError, match="gears were expected but no graph input has a gear dim"):
        merge_gears([], "zip")


# TorchAir's tests/st/torchair_gear_st.py, on merge_gears (GE's generate_dynamic_dims_option with
# _GeInputInfo does not exist here: the same gears, as GearDims); str(err) starts with TorchAir's
# exact text, followed by which dims and the fix
def test_peer_config_zip_list_lens_same():
    """torchair_gear_st.py::test_config_zip_list_lens_same"""
    dims = [GearDim(0, "arg1", 0, (8, 4)), GearDim(1, "arg2", 0, (8, 4, 3))]
    with pytest.raises(AssertionError) as info:
        merge_gears(dims, "zip")
    assert str(info.value).startswith(
        "when dynamic_gears_merge_policy is zip, input gears len must same.")


def test_peer_gears_num_not_over_100():
    """torchair_gear_st.py::test_gears_num_not_over_100"""
    dims = [GearDim(0, "arg1", 0, tuple(range(1, 10))), GearDim(1, "arg2", 0, tuple(range(10, 20))),
            GearDim(2, "arg3", 0, tuple(range(20, 30)))]
    with pytest.raises(AssertionError) as info:
        merge_gears(dims, "product")
    assert str(info.value).startswith("The total number of gears set cannot exceed 100, "
                                      "and the current number of gears is: 900")


def test_peer_set_dim_gears_value():
    """torchair_gear_st.py::test_set_dim_gears_value"""
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: [0, 2]})
    assert str(info.value) == "Gear value at index 0 for dim index 0 must not be 0, but got 0."


def test_unequal_zip_lengths_fail_at_compile_with_the_tensors_named():
    model = torch.compile(Cat(), fullgraph=True, backend=_backend("zip"))
    x1, x2 = torch.ones(2, 2), torch.ones(2, 2)
    set_dim_gears(x1, {0: [2, 4]})
    set_dim_gears(x2, {0: [2, 4, 8]})
    with pytest.raises(Exception, match=r"AssertionError: when dynamic_gears_merge_policy is zip, "
                                        r"input gears len must same\. .*L_x1_.* has 2 \[2, 4\], "
                                        r".*L_x2_.* has 3 \[2, 4, 8\]"):
        model(x1, x2)


def test_a_gear_dim_traced_with_a_fixed_size_is_an_error():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchair.core.pipeline import GraphSignature, compile_graph

    gm = make_fx(lambda x: (x * 2,))(torch.ones(2, 3))
    signature = GraphSignature(("x",), ("tensor",), ((0, 0, (2, 4)),))
    with pytest.raises(ValueError, match=r"input 0 \(`x`\) dim 0 has gears \[2, 4\] but was traced "
                                         r"with a fixed size 2"):
        compile_graph(gm, [torch.ones(2, 3)], torchair.CompilerConfig(), signature)


# ---- gears with value-dependent ops, tiling sink, mark_static, captures, dumps ----------------

GEARS = [1, 2, 4, 8]


def _decode_run(steps, *, capture=None, dump=None):
    torch.manual_seed(0)
    model = DecodeStep().eval()
    counter = _backend("zip", tiling=True, dump=dump)
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    caches = {b: [torch.randn(b, CAPACITY, KV_HEADS * HEAD_DIM) for _ in range(2)] for b in GEARS}
    eager = {b: [c.clone() for c in caches[b]] for b in GEARS}
    worst = 0.0
    with torch.no_grad(), capture_mode(capture):
        for step in range(steps):
            b = GEARS[(step * 3 + step // 4) % len(GEARS)]
            x = torch.randn(b, 1, HIDDEN)
            pos = torch.tensor([step % CAPACITY])
            torch._dynamo.mark_static(pos)
            if step < len(GEARS):
                for t in (x, *caches[b]):
                    set_dim_gears(t, {0: GEARS})
            lengths = [(step * 7) % (CAPACITY - 2) + 2]  # one length for every sequence
            out = compiled(x, pos, *caches[b], lengths)
            ref = model(x, pos, *eager[b], lengths)
            worst = max(worst, (out - ref).abs().max().item())
            for got, want in zip(caches[b], eager[b]):
                assert torch.equal(got, want)
    return counter, worst, torchair.graph_reports()[-1]


def test_thousand_calls_cycling_gears_and_lengths_never_recompile():
    counter, worst, report = _decode_run(1000)
    assert counter.frame_count == 1
    assert worst < 1e-5
    assert report.build_static and report.value_dependent_ops == ["npu_incre_flash_attention"]
    assert report.sunk_inputs == ["L_actual_seq_lengths_0_"]
    assert [g["built"] for g in report.gears] == [True] * len(GEARS)


def test_gears_with_captured_replay_per_gear():
    counter, worst, report = _decode_run(40, capture="emulate")
    assert counter.frame_count == 1 and worst < 1e-5
    assert report.launch.startswith("one launch unit: captured replay")


def test_dumps_list_the_gears_and_one_optimized_graph_per_built_gear(tmp_path):
    _, _, report = _decode_run(2, dump=("txt", tmp_path))
    original = [d for d in report.dumps if "original" in d]
    optimized = [d for d in report.dumps if "optimized" in d]
    assert len(original) == 1 and len(optimized) == 2  # two gears used so far
    header = pathlib.Path(original[0]).read_text().splitlines()[0]
    assert header.startswith("# gears (zip): (L_x_[0]=1, L_k_cache_[0]=1, L_v_cache_[0]=1); (")
    texts = [pathlib.Path(p).read_text() for p in optimized]
    assert texts[0].startswith("# gear 1/4: L_x_[0]=1") and texts[1].startswith("# gear 4/4")
    assert "float32[1, 1, 64]" in texts[0] and "[-1" not in texts[0]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_seed_example_on_cuda_captures_one_graph_per_gear():
    counter = _backend("zip", inductor=True)
    model = torch.compile(Add(), fullgraph=True, backend=counter)
    x1, x2 = torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda")
    set_dim_gears(x1, {0: [2, 4]})
    set_dim_gears(x2, {0: [2, 4]})
    torch.testing.assert_close(model(x1, x2), x1 + x2)  # the gears travel on the first inputs
    for n in (4, 2, 4):
        a, b = torch.randn(n, 2, device="cuda"), torch.randn(n, 2, device="cuda")
        torch.testing.assert_close(model(a, b), a + b)
    report = torchair.graph_reports()[-1]
    assert counter.frame_count == 1 and report.launch == "one launch unit: CUDA graph replay"


def test_other_dims_of_a_gear_tensor_are_static_under_dynamic_true():
    """With dynamic=True a dim without gears would be symbolic (a shape-generic host build);
    set_dim_gears fixes it so every gear is one static launch unit."""
    counter = _backend()
    model = torch.compile(lambda x: x * 2 + 1, backend=counter, dynamic=True, fullgraph=True)
    x = torch.randn(2, 5)
    set_dim_gears(x, {0: [2, 4]})
    for b in (2, 4):
        x = x if b == 2 else torch.randn(b, 5)
        torch.testing.assert_close(model(x), x * 2 + 1)
    report = torchair.graph_reports()[-1]
    assert counter.frame_count == 1 and report.build_static
    assert report.inputs[-1].shape == (-1, 5)
    model(torch.randn(2, 6))  # the fixed dim is guarded: another size is another graph
    assert counter.frame_count == 2
