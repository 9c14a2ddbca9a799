"""cache_compile: tensors a compiled method stores on its modules (a rope's cos/sin caches) are
stored again after every warm call, as Dynamo's code stores them; stores a cached graph cannot
replay keep the function uncached; TorchAir's extra keywords (fullgraph, dynamic)."""
import json
import logging
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import torchair
from torchair.inference import cache_compile, readable_cache

ROPE = '''
import torch


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)


class RotaryEmbedding(torch.nn.Module):
    """vllm-ascend's rope shape: a cos/sin table, and the rows of the step kept on the module."""

    def __init__(self, dim=8, max_positions=32):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.outer(torch.arange(max_positions).float(), inv)
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), -1),
                             persistent=False)

    def forward(self, positions, query, key):
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, -1)
        self.cos_cached = cos.unsqueeze(1)
        self.sin_cached = sin.unsqueeze(1)
        return (rotate(query, self.cos_cached, self.sin_cached),
                rotate(key, self.cos_cached, self.sin_cached))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 16)
        self.rotary_emb = RotaryEmbedding()

    def decode(self, positions, x):
        q = self.q_proj(x).view(-1, 2, 8)
        q, k = self.rotary_emb(positions, q, x.view(-1, 2, 8))
        self._cos = self.rotary_emb.cos_cached  # the same tensor, under a second name
        self.last_q = q  # also returned
        return q, (q * k).sum(-1)
'''


def _config():
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    return config


def test_rope_stores_are_replayed_by_a_warm_process(tmp_path):
    (tmp_path / "rope_src.py").write_text(ROPE)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f'''
        import copy, json, sys, torch, torchair
        sys.path.insert(0, {str(tmp_path)!r})
        import rope_src
        warm = sys.argv[1] == "warm"
        if warm:
            def refuse(*a, **k):
                raise SystemExit("Dynamo was entered")
            torch.compile = refuse
            torch._dynamo.optimize = refuse
        torch.manual_seed(0)
        config = torchair.CompilerConfig()
        config.debug.run_eagerly = True
        m = rope_src.Attention()
        twin = copy.deepcopy(m)  # runs eagerly
        step = torchair.inference.cache_compile(m.decode, config=config, dynamic=True,
                                                fullgraph=True, cache_dir={str(tmp_path / "c")!r})
        assert not hasattr(m.rotary_emb, "cos_cached")
        report = {{"checks": 0}}
        with torch.no_grad():
            for positions in ([1, 2, 3], [7, 8, 9], [30, 4]):  # the last: another size
                pos = torch.tensor(positions)
                x = torch.randn(len(positions), 16)
                m.rotary_emb.cos_cached = torch.zeros(1)  # a stale value a call must replace
                out = step(pos, x)
                ref = twin.decode(pos, x)
                assert all(torch.equal(a, b) for a, b in zip(out, ref)), positions
                for name in ("cos_cached", "sin_cached"):
                    got, want = getattr(m.rotary_emb, name), getattr(twin.rotary_emb, name)
                    assert torch.equal(got, want) and got.shape == (len(positions), 1, 4), name
                assert m._cos is m.rotary_emb.cos_cached  # one tensor, as eagerly
                assert m.last_q is out[0]
                assert m.rotary_emb.cos_cached.data_ptr() != out[0].data_ptr()
                report["checks"] += 1
        report["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        report["served"] = step.runtime is not None
        report["launch"] = torchair.graph_reports()[-1].launch
        print("REPORT", json.dumps(report))
    '''))
    reports = {}
    for phase in ("cold", "warm"):
        done = subprocess.run([sys.executable, str(script), phase], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
        reports[phase] = json.loads(line[len("REPORT "):])
        assert "not cached" not in done.stderr, done.stderr
    assert reports["cold"] == dict(reports["cold"], checks=3, graphs=1, served=True)
    assert reports["warm"] == dict(reports["warm"], checks=3, graphs=0, served=True)
    assert "from cache_compile" in reports["warm"]["launch"]
    (entry,) = pathlib.Path(tmp_path / "c").rglob("meta.json")
    writes = json.loads(entry.read_text())["writes"]
    assert sorted(w[1] for w in writes) == ["_cos", "cos_cached", "last_q", "sin_cached"]
    assert all(isinstance(w[2], dict) and set(w[2]) <= {"out", "in"} for w in writes), writes
    text = readable_cache(entry, print_output=False)
    assert "after each call: L['self'].last_q = graph output" in text


class Accumulate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.total = torch.zeros(4)

    def step(self, x):
        self.total = self.total + x.sum(0)  # reads the attribute the last call stored
        self.seen = x  # a graph input, stored as is
        return self.total * 2


def test_stored_tensors_follow_each_warm_call(tmp_path, torchair_log, monkeypatch):
    cold, eager = Accumulate(), Accumulate()
    xs = [torch.randn(n, 4) for n in (2, 3, 2, 5)]
    with torch.no_grad():
        cache_compile(cold.step, config=_config(), cache_dir=str(tmp_path))(xs[0])
    assert list(tmp_path.rglob("meta.json")), [r.getMessage() for r in torchair_log]
    torch._dynamo.reset()
    warm = Accumulate()
    step = cache_compile(warm.step, config=_config(), cache_dir=str(tmp_path))

    def refuse(*args, **kwargs):
        raise AssertionError("Dynamo was entered on a warm start")

    monkeypatch.setattr(torch, "compile", refuse)
    with torch.no_grad():
        for x in xs:
            out = step(x)
            assert torch.equal(out, eager.step(x))
            assert torch.equal(warm.total, eager.total)  # each call builds on the last store
            assert warm.seen is x
            assert out.data_ptr() != warm.total.data_ptr()
    assert step.runtime is not None
    assert not [r for r in torchair_log if r.levelno >= logging.WARNING]


_HOLDER = type("Holder", (), {})()


class Unreplayable(torch.nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case

    def step(self, x):
        if self.case == "global object":
            _HOLDER.t = x + 1  # a tensor on an object that is not a module
        elif self.case == "list":
            self.pair = [x + 1, x + 2]  # a new list each call
        else:
            self.rows = x.shape[0]  # a size: symbolic under dynamic=True
        return x * 2


@pytest.mark.parametrize("case, named", [("global object", "G['_HOLDER'] (.t)"),
                                         ("list", "L['self'] (.pair)"),
                                         ("size", "L['self'] (.rows)")])
def test_stores_a_cached_graph_cannot_replay_are_not_cached(tmp_path, torchair_log, case,
                                                            named):
    model = Unreplayable(case)
    step = cache_compile(model.step, config=_config(), cache_dir=str(tmp_path))
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.equal(step(x), x * 2)
    messages = [r.getMessage() for r in torchair_log if r.levelno >= logging.WARNING]
    assert any("compiled, not cached: the function mutates Python state" in m and named in m
               for m in messages), messages
    assert not list(tmp_path.rglob("meta.json"))
    if case == "list":
        assert torch.equal(model.pair[1], x + 2)  # Dynamo's own replay, this process
    elif case == "size":
        assert model.rows == 3


class Scale(torch.nn.Module):
    def step(self, x):
        return x * 3


def test_torchair_keywords(tmp_path, torchair_log):
    """vllm-ascend's call: dynamic= and fullgraph= next to config; dynamic is in the key."""
    model = Scale()
    entries = {}
    for dynamic in (False, True):
        torchair_log.clear()
        fn = cache_compile(model.step, config=_config(), dynamic=dynamic, fullgraph=True,
                           cache_dir=str(tmp_path / str(dynamic)))
        with torch.no_grad():
            x = torch.randn(2, 4)
            assert torch.equal(fn(x), x * 3)
            (entry,) = (tmp_path / str(dynamic)).rglob("meta.json")
            entries[dynamic] = entry
            meta = json.loads(entry.read_text())
            assert meta["key"]["dynamic"] is dynamic
            assert entry.parent.parent.name.startswith(
                "Scale_dynamic_" if dynamic else "Scale_static_")
            x = torch.randn(3, 4)  # static: another size fails a guard and compiles again
            assert torch.equal(fn(x), x * 3)
        recompiled = [r for r in torchair_log if "func recompiled" in r.getMessage()]
        assert bool(recompiled) is not dynamic
        assert entries[dynamic].exists() is dynamic  # (TorchAir drops a recompiled entry too)
    assert entries[False].parent.parent.name[-16:] != entries[True].parent.parent.name[-16:]

    torchair_log.clear()
    cache_compile(model.step, config=_config(), fullgraph=False)  # TorchAir's: noted, ignored
    assert any("fullgraph=False is ignored" in r.getMessage() for r in torchair_log)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'mode'.*accepts config, "
                                        r"backend, dynamic.*fullgraph"):
        cache_compile(model.step, mode="max-autotune")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        cache_compile(model.step, bogus=1)
    with pytest.raises(TypeError, match="dynamic must be True, False or None"):
        cache_compile(model.step, dynamic="yes")
    with pytest.raises(TypeError, match="fullgraph must be True or False"):
        cache_compile(model.step, fullgraph=1)
