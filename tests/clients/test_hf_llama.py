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
    assert report.engine == engine
    # the static cache's K/V tensors are graph inputs written in place, [B, kv heads, len, D]
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_shape = (1, cfg.num_key_value_heads, PROMPT + NEW, head_dim)
    kv = [i for i in report.inputs if i.mutated and i.shape == kv_shape]
    assert len(kv) == 2 * cfg.num_hidden_layers, str(report)
