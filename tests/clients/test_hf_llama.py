"""A real client: Hugging Face ``transformers``' ``LlamaForCausalLM`` with its static KV cache,
``model.forward`` compiled with the torchair backend.

The model is built from a small ``LlamaConfig`` with seeded random weights (nothing is
downloaded). The prompt is prefilled eagerly into a ``StaticCache``; then greedy decoding runs one
token per call, eagerly and through the compiled ``forward``, each with its own cache. The
compiled decode must give exactly eager's tokens, compile once, and be one static launch unit.
"""
import pytest
import torch
import torch._dynamo.testing

import torchair

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face client test needs transformers (pip install "
                           "transformers, or pip install -e '.[test]')")
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache  # noqa: E402

PROMPT, NEW = 6, 12


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _generate(model: LlamaForCausalLM, forward, prompt: torch.Tensor) -> torch.Tensor:
    """Prefill eagerly, then ``NEW - 1`` greedy decode steps through ``forward``."""
    cache = StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(PROMPT),
                    use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        tokens = [token]
        for pos in range(PROMPT, PROMPT + NEW - 1):
            out = forward(input_ids=token, past_key_values=cache,
                          cache_position=torch.tensor([pos]), use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
    return torch.cat(tokens, dim=1)


@pytest.mark.parametrize("engine", ["fx", pytest.param("inductor", marks=pytest.mark.inductor)])
def test_llama_static_cache_decode_matches_eager_in_one_static_graph(engine):
    model = _model()
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                           generator=torch.Generator().manual_seed(1))
    eager = _generate(model, model.forward, prompt)

    config = torchair.CompilerConfig()
    config.debug.run_eagerly = engine == "fx"
    counter = torch._dynamo.testing.CompileCounterWithBackend(
        torchair.get_npu_backend(compiler_config=config))
    compiled = torch.compile(model.forward, backend=counter, fullgraph=True)
    before = len(torchair.graph_reports())
    graph = _generate(model, compiled, prompt)

    assert torch.equal(graph, eager), f"graph tokens {graph.tolist()} != eager {eager.tolist()}"
    assert counter.frame_count == 1, "the decode step recompiled"
    reports = torchair.graph_reports()[before:]
    assert len(reports) == 1
    report = reports[0]
    assert report.build_static, str(report)
    assert report.launch.startswith("one launch unit"), report.launch
    assert report.engine == {"fx": "fx", "inductor": "inductor-cpp"}[engine]  # static CPU unit
    # the static cache's K/V tensors are graph inputs written in place, [B, kv heads, len, D]
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_shape = (1, cfg.num_key_value_heads, PROMPT + NEW, head_dim)
    kv = [i for i in report.inputs if i.mutated and i.shape == kv_shape]
    assert len(kv) == 2 * cfg.num_hidden_layers, str(report)


CACHED_LLAMA = '''
import json, sys
import torch, torchair
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

PROMPT, NEW = 6, 8


class Runner(torch.nn.Module):
    def __init__(self, model, cache_dir):
        super().__init__()
        self.model = model
        config = torchair.CompilerConfig()
        config.debug.run_eagerly = True
        self.cached = torchair.inference.cache_compile(self.decode, config=config,
                                                       cache_dir=cache_dir)

    def decode(self, input_ids, cache_position, past_key_values):
        return self.model(input_ids=input_ids, past_key_values=past_key_values,
                          cache_position=cache_position, use_cache=True).logits


def generate(model, step, prompt):
    cache = StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    with torch.no_grad():
        out = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(PROMPT),
                    use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        tokens = [token]
        for pos in range(PROMPT, PROMPT + NEW - 1):
            token = step(token, torch.tensor([pos]), cache)[:, -1:].argmax(-1)
            tokens.append(token)
    return torch.cat(tokens, 1)


torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
runner = Runner(model, sys.argv[1])
prompt = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(1))
eager = generate(model, runner.decode, prompt)
cached = generate(model, runner.cached, prompt)
dynamo = sys.modules.get("torch._dynamo")
print(json.dumps({"equal": bool(torch.equal(eager, cached)),
                  "graphs": dynamo.utils.counters["stats"]["unique_graphs"] if dynamo else 0}))
'''


def test_llama_decode_step_cache_compile_warm_starts_in_a_new_process(tmp_path):
    """A transformers decode step (StaticCache, output-capturing globals that the step sets and
    resets, ~300 Dynamo guards) is cached by the cold process and served by a warm one without
    Dynamo, with eager's tokens."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "cached_llama.py"
    script.write_text(CACHED_LLAMA)
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "c")],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TORCHAIR_LOG_LEVEL="INFO"))
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append((json.loads(done.stdout.strip().splitlines()[-1]), done.stderr))
    (cold, cold_log), (warm, warm_log) = runs
    assert cold["equal"] and "saved " in cold_log, cold_log[-3000:]
    assert warm["equal"] and warm["graphs"] == 0, warm_log[-3000:]
    assert "loaded " in warm_log and "[torchair WARNING]" not in warm_log, warm_log[-3000:]
