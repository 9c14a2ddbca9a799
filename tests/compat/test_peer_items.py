"""Issue 17, item by item: a script written for Ascend (``import torch_npu``, ``"npu"`` devices,
streams, events, TorchAir's ops, scopes and options) runs unchanged under ``emulate_npu("cpu")``
and gives the results of the same script written for the CPU.

Each case is a pair of script texts run with ``exec``: the NPU one under the emulation, its CPU
twin without it. Both leave a dict ``result`` of tensors (and plain values); the twin writes what a
CPU user would write (no torch_npu, plain torch math, the CPU device), so the comparison checks
the emulation and the TorchAir API, not one script against itself. ``EXACT`` cases run the same
ATen ops on both sides and must agree bit for bit.
"""
import textwrap

import pytest
import torch

from torchair import compat

HEADER_NPU = """
import torch, torch_npu, torchair
from torchair.configs.compiler_config import CompilerConfig
torch.npu.manual_seed(0)
"""
HEADER_CPU = """
import torch, torchair
from torchair.configs.compiler_config import CompilerConfig
torch.manual_seed(0)
"""

CASES = {
    # -------------------------------------------------------------- item 1: the emulation
    "devices": ("""
        x = torch.randn(4, 8, device="npu")
        y = torch.ones(8, device=torch.device("npu", 0)).to("npu:0")
        lin = torch.nn.Linear(8, 3).to("npu")
        lin2 = torch.nn.Linear(3, 2).npu()
        fn = torch.compile(lambda a, b: lin2(lin(a + b) * torch.arange(3, device="npu:0")),
                           backend=torchair.get_npu_backend(), fullgraph=True)
        result = {"out": fn(x, y).cpu(), "dev": str(x.device),
                  "zeros": torch.zeros(2, device=torch.device("npu:0")).cpu()}
    """, """
        x = torch.randn(4, 8)
        y = torch.ones(8)
        lin = torch.nn.Linear(8, 3)
        lin2 = torch.nn.Linear(3, 2)
        fn = torch.compile(lambda a, b: lin2(lin(a + b) * torch.arange(3)),
                           backend=torchair.get_npu_backend(), fullgraph=True)
        result = {"out": fn(x, y), "dev": "cpu", "zeros": torch.zeros(2)}
    """),
    "streams_events": ("""
        s = torch.npu.Stream()
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        x = torch.randn(16, 16, device="npu")
        start.record()
        with torch.npu.stream(s):
            assert torch.npu.current_stream() == s
            y = x @ x
            ev = torch.npu.Event()
            ev.record(s)
        torch.npu.current_stream().wait_event(ev)
        ev.wait()
        end.record()
        end.synchronize()
        torch.npu.synchronize()
        result = {"y": y.cpu(), "timed": start.elapsed_time(end) >= 0.0,
                  "default_again": torch.npu.current_stream() == torch.npu.default_stream(),
                  "done": ev.query()}
    """, """
        x = torch.randn(16, 16)
        y = x @ x
        result = {"y": y, "timed": True, "default_again": True, "done": True}
    """),
    "memory_seed_device": ("""
        torch.npu.set_device(0)
        torch.npu.manual_seed(5)
        a = torch.rand(3, device="npu")
        torch.npu.manual_seed_all(6)
        b = torch.randn(2, device="npu:0")
        torch.npu.empty_cache()
        torch.npu.reset_peak_memory_stats()
        result = {"a": a.cpu(), "b": b.cpu(), "mem": torch.npu.memory_allocated(),
                  "max_mem": torch.npu.max_memory_allocated(),
                  "name": isinstance(torch.npu.get_device_name(0), str),
                  "count": torch.npu.device_count(), "current": torch.npu.current_device()}
    """, """
        torch.manual_seed(5)
        a = torch.rand(3)
        torch.manual_seed(6)
        b = torch.randn(2)
        result = {"a": a, "b": b, "mem": 0, "max_mem": 0, "name": True, "count": 1,
                  "current": 0}
    """),
    "config_utils": ("""
        torch_npu.npu.config.allow_internal_format = False
        torch.npu.matmul.allow_hf32 = True
        torch.npu.conv.allow_hf32 = False
        torch.npu.set_option({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"})
        torch.npu.set_compile_mode(jit_compile=False)
        x = torch.randn(4, 4).npu()
        result = {"mm": (x @ x).cpu(), "fmt": torch_npu.npu.config.allow_internal_format,
                  "hf32": torch.npu.matmul.allow_hf32,
                  "cann": torch_npu.npu.utils.get_cann_version() == "",
                  "jit_off": torch.npu.is_jit_compile_false(),
                  "nd": torch_npu.get_npu_format(x)}
    """, """
        x = torch.randn(4, 4)
        result = {"mm": x @ x, "fmt": False, "hf32": True, "cann": True, "jit_off": True,
                  "nd": 2}
    """),
    # -------------------------------------------------------------- item 2: the API
    "npu_print": ("""
        def fn(x):
            y = x * 2
            torchair.ops.npu_print("y is", y, summarize_size=2)
            return y + 1
        step = torch.compile(fn, backend=torchair.get_npu_backend(), fullgraph=True)
        result = {"out": step(torch.arange(6.0, device="npu")).cpu()}
    """, """
        def fn(x):
            y = x * 2
            print("y is", y)
            return y + 1
        result = {"out": fn(torch.arange(6.0))}
    """),
    "tagged_events": ("""
        EV1 = torchair.ops.npu_create_tagged_event(tag="peer_items_66")
        EV2 = torchair.ops.npu_create_tagged_event(tag="peer_items_77")

        class Model(torch.nn.Module):
            def forward(self, in1, in2, in3, in4):
                add_result = torch.add(in1, in2)
                torchair.ops.npu_tagged_event_record(EV1)
                with torchair.scope.npu_stream_switch("1", 3, enable_inner_parallel=True):
                    torchair.ops.npu_tagged_event_wait(EV1)
                    mm_result = torch.mm(in3, in4)
                    torchair.ops.npu_tagged_event_record(EV2)
                    b = in3 + in4
                    torchair.ops.npu_record_tagged_stream(b, "1")
                torchair.ops.npu_tagged_event_wait(EV2)
                mm1 = torch.mm(in3, in4)
                return add_result, mm_result, mm1, b

        config = CompilerConfig()
        config.mode = "reduce-overhead"
        model = torch.compile(Model(), backend=torchair.get_npu_backend(compiler_config=config),
                              fullgraph=True)
        ins = [torch.randn(8, 8, device="npu") for _ in range(4)]
        result = {f"o{i}": t.cpu() for i, t in enumerate(model(*ins))}
    """, """
        ins = [torch.randn(8, 8) for _ in range(4)]
        outs = (ins[0] + ins[1], ins[2] @ ins[3], ins[2] @ ins[3], ins[2] + ins[3])
        result = {f"o{i}": t for i, t in enumerate(outs)}
    """),
    "record_wait": ("""
        def fn(x):
            y = x.sin()
            with torchair.scope.npu_stream_switch("2"):
                torchair.ops.wait([y])
                z = y * 3
                done = torchair.ops.record()
            torchair.ops.wait([done])
            return z + y
        step = torch.compile(fn, backend=torchair.get_npu_backend(), fullgraph=True)
        result = {"out": step(torch.randn(5, device="npu")).cpu()}
    """, """
        x = torch.randn(5)
        y = x.sin()
        result = {"out": y * 3 + y}
    """),
    "fia_v2": ("""
        q = torch.randn(2, 4, 1, 16, dtype=torch.float32).npu()     # BNSD, decode
        k = torch.randn(2, 2, 12, 16).npu()
        v = torch.randn(2, 2, 12, 16).npu()
        out, lse = torch_npu.npu_fused_infer_attention_score_v2(
            q, k, v, num_query_heads=4, num_key_value_heads=2, input_layout="BNSD",
            softmax_scale=0.25, actual_seq_kvlen=[12, 7])
        result = {"out": out.cpu()}
    """, """
        q = torch.randn(2, 4, 1, 16)
        k = torch.randn(2, 2, 12, 16)
        v = torch.randn(2, 2, 12, 16)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        outs = []
        for b, n in enumerate([12, 7]):
            p = torch.softmax(q[b] @ k[b, :, :n].transpose(-1, -2) * 0.25, -1)
            outs.append(p @ v[b, :, :n])
        result = {"out": torch.stack(outs)}
    """),
    "ascend_scopes": ("""
        def fn(x, y):
            with torchair.scope.limit_core_num(8, 16):
                a = x.exp()
                with torchair.scope.op_never_timeout(True):
                    b = a * y
            with torchair.scope.data_dump():
                c = b - 1
            with torchair.scope.profiler_trace("step", "both"):
                return c.relu()
        step = torch.compile(fn, backend=torchair.get_npu_backend(), fullgraph=True)
        x, y = torch.randn(6).npu(), torch.randn(6).npu()
        with torchair.scope.limit_core_num(4, 4):
            eager = fn(x, y)
        result = {"out": step(x, y).cpu(), "eager": eager.cpu()}
    """, """
        x, y = torch.randn(6), torch.randn(6)
        out = (x.exp() * y - 1).relu()
        result = {"out": out, "eager": out}
    """),
    "module_aliases": ("""
        from torchair.npu_fx_compiler import get_npu_backend, get_compiler
        from torchair.experimental.inference import use_internal_format_weight
        from torchair.patterns.pattern_pass_manager import register_replacement
        assert callable(get_compiler(CompilerConfig())) and callable(register_replacement)
        assert torchair.compat is not None
        model = torch.nn.Linear(8, 4).npu()
        use_internal_format_weight(model)
        w = torchair.npu_format_cast_via_cpu(model.weight.data, 29)
        x = torch.randn(3, 8, device="npu")
        a = torch.compile(model, backend=get_npu_backend(), fullgraph=True)(x)
        b = torch.compile(model, backend="torchair", fullgraph=True)(x)
        result = {"a": a.detach().cpu(), "b": b.detach().cpu(), "w": w.cpu()}
    """, """
        model = torch.nn.Linear(8, 4)
        x = torch.randn(3, 8)
        out = model(x).detach()
        result = {"a": out, "b": out, "w": model.weight.data}
    """),
    # -------------------------------------------------------------- item 3: the options
    "mode_npugraph_ex": ("""
        config = CompilerConfig()
        config.mode = "npugraph_ex"
        f = torch.compile(lambda x: (x @ x.T).softmax(-1), fullgraph=True,
                          backend=torchair.get_npu_backend(compiler_config=config))
        x = torch.randn(4, 6, device="npu:0")
        result = {"out": f(x).cpu(), "mode": config.mode.value}
    """, """
        x = torch.randn(4, 6)
        result = {"out": (x @ x.T).softmax(-1), "mode": "npugraph_ex"}
    """),
    "custom_passes": ("""
        seen = []

        def pre(gm, example_inputs, config):
            seen.append(("pre", len(example_inputs)))
            for node in gm.graph.nodes:           # rewrite: sin -> cos, before torchair's passes
                if node.target == torch.ops.aten.sin.default:
                    node.target = torch.ops.aten.cos.default
            gm.recompile()

        def post(gm, example_inputs, config):
            seen.append(("post", config.mode.value))

        config = CompilerConfig()
        config.post_grad_custom_pre_pass = pre
        config.post_grad_custom_post_pass = post
        config.debug.run_eagerly = True
        f = torch.compile(lambda x: x.sin() + 1, fullgraph=True,
                          backend=torchair.get_npu_backend(compiler_config=config))
        result = {"out": f(torch.randn(5).npu()).cpu(), "seen": seen}
    """, """
        x = torch.randn(5)
        result = {"out": x.cos() + 1, "seen": [("pre", 1), ("post", "max-autotune")]}
    """),
    "data_dump": ("""
        import os, tempfile
        dump_dir = tempfile.mkdtemp()
        config = CompilerConfig()
        config.debug.data_dump.type = "npy"
        config.debug.data_dump.path = dump_dir
        f = torch.compile(lambda x, y: (x * y).sum(-1), fullgraph=True,
                          backend=torchair.get_npu_backend(compiler_config=config))
        x, y = torch.randn(3, 4, device="npu"), torch.randn(3, 4, device="npu")
        out = f(x, y)
        files = [n for _, _, names in os.walk(dump_dir) for n in names if n.endswith(".npy")]
        result = {"out": out.cpu(), "dumped_inputs": any(".INPUT." in n for n in files),
                  "dumped_outputs": any(".OUTPUT." in n for n in files)}
    """, """
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        result = {"out": (x * y).sum(-1), "dumped_inputs": True, "dumped_outputs": True}
    """),
    "ascend_only_options": ("""
        config = CompilerConfig()
        config.debug.run_eagerly = True
        config.dump_config.enable_dump = True
        config.dump_config.dump_mode = "all"
        config.aoe_config.aoe_mode = "2"
        config.fusion_config.fusion_switch_file = None
        config.ge_config.enable_single_stream = True
        config.experimental_config.frozen_parameter = True
        config.experimental_config.npu_fx_pass = True
        config.experimental_config.remove_noop_ops = True
        config.export.experimental.enable_lite_export = False
        effect = CompilerConfig.registry()["dump_config.enable_dump"].effect
        assert "dump_config.enable_dump" in CompilerConfig.describe()
        f = torch.compile(lambda x: torch.nn.functional.gelu(x[:, :]).repeat(1, 1),
                          fullgraph=True, backend=torchair.get_npu_backend(compiler_config=config))
        result = {"out": f(torch.randn(4, 4).npu()).cpu(),
                  "dump_here": effect,
                  "dump_value": config.dump_config.enable_dump.value}
    """, """
        x = torch.randn(4, 4)
        result = {"out": torch.nn.functional.gelu(x), "dump_here": "no effect here",
                  "dump_value": "1"}
    """),
    # -------------------------------------------------------------- item 4: gears, no-ops
    "gears": ("""
        config = CompilerConfig()
        config.debug.run_eagerly = True
        f = torch.compile(lambda x: x.cumsum(0) * 2, dynamic=True, fullgraph=True,
                          backend=torchair.get_npu_backend(compiler_config=config))
        outs = []
        for n in (2, 4, 4, 2):
            x = torch.randn(n, 3, device="npu")
            torchair.inference.set_dim_gears(x, dim_gears={0: [2, 4, 4]})  # repeated: allowed
            outs.append(f(x).cpu())
        result = {f"o{i}": o for i, o in enumerate(outs)}
    """, """
        outs = [torch.randn(n, 3).cumsum(0) * 2 for n in (2, 4, 4, 2)]
        result = {f"o{i}": o for i, o in enumerate(outs)}
    """),
    "remove_noop_ops": ("""
        config = CompilerConfig()
        config.debug.run_eagerly = True
        config.experimental_config.remove_noop_ops = True

        def fn(x, n):
            y = x[0:4].repeat(1, 1)
            y = torch.nn.functional.pad(y, (0, 0))
            y = torch.cat([y]) ** 1
            z = torch.ceil(n) + torch.clone(y).sum()
            return y.clone() * 2, z
        f = torch.compile(fn, fullgraph=True,
                          backend=torchair.get_npu_backend(compiler_config=config))
        out = f(torch.randn(4, 3).npu(), torch.arange(3, device="npu"))
        result = {"y": out[0].cpu(), "z": out[1].cpu(),
                  "removed": torchair.graph_reports()[-1].passes.get("remove_noops", 0) > 0}
    """, """
        x, n = torch.randn(4, 3), torch.arange(3)
        result = {"y": x * 2, "z": n + x.sum(), "removed": True}
    """),
}
# same ATen ops, or Inductor kernels that only add and multiply (sin/exp may round differently)
EXACT = {"devices", "streams_events", "memory_seed_device", "config_utils", "npu_print",
         "tagged_events", "module_aliases", "custom_passes", "data_dump", "gears",
         "remove_noop_ops"}


def _run(src: str, header: str) -> dict:
    scope: dict = {}
    exec(compile(header + textwrap.dedent(src), "<peer script>", "exec"), scope)
    return scope["result"]


def _same(npu, cpu, exact: bool, where: str) -> None:
    if isinstance(cpu, torch.Tensor):
        assert isinstance(npu, torch.Tensor) and npu.device.type == "cpu", where
        if exact:
            assert torch.equal(npu, cpu), where
        else:
            torch.testing.assert_close(npu, cpu, rtol=1e-5, atol=1e-5, msg=where)
    else:
        assert npu == cpu, (where, npu, cpu)


@pytest.mark.parametrize("name", sorted(CASES))
def test_peer_item_under_emulation_matches_the_cpu_script(name, capsys):
    npu_src, cpu_src = CASES[name]
    torch._dynamo.reset()
    with compat.emulate_npu("cpu"):
        npu = _run(npu_src, HEADER_NPU)
    npu_out = capsys.readouterr().out
    assert torch.device is torch._C.device and torch._C._len_torch_function_stack() == 0
    cpu = _run(cpu_src, HEADER_CPU)
    cpu_out = capsys.readouterr().out
    assert sorted(npu) == sorted(cpu)
    for key in cpu:
        _same(npu[key], cpu[key], name in EXACT, f"{name}: {key}")
    if name == "npu_print":  # the graph printed the tensor the eager script printed
        assert npu_out.strip().splitlines()[-1].startswith("y is [0 2 ... 8 10]"), npu_out
        assert cpu_out.startswith("y is tensor([ 0.,  2.,  4.,  6.,  8., 10.])")
