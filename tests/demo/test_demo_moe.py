"""``torchair demo --experts E --top-k K``: the MoE decoder (torch_npu's MoE ops in every layer)
generates the same tokens compiled as eagerly, in one static graph per batch gear."""
import pytest
import torch

import torchair.demo
from tests.demo.test_demo import _run
from torchair.demo.model import Decoder, DemoConfig


def test_moe_demo_tokens_equal_eager_one_static_graph(tmp_path, capsys):
    code, result = _run(tmp_path, "--engine", "fx", "--batch", "2", "--steps", "3",
                        "--experts", "4", "--top-k", "2", "--no-cache-compile")
    assert code == 0
    assert result["tokens_equal"] and result["rows"][0]["tokens_equal"]
    assert result["dynamo_compiles"] == 1 and result["recompiles"] == 0
    assert result["build_static"] and result["path"] == 4 and result["graphs_reported"] == 1
    assert result["model"]["experts"] == 4 and result["model"]["top_k"] == 2
    assert "MoE 4 experts x SwiGLU 128, top-2" in capsys.readouterr().out


def test_moe_layers_use_the_moe_ops_and_route_by_token():
    cfg = DemoConfig(layers=1, hidden=32, heads=2, kv_heads=1, intermediate=16, vocab=16,
                     experts=4, top_k=2)
    torch.manual_seed(0)
    model = Decoder(cfg)
    layer = model.layers[0]
    assert not hasattr(layer, "gate_proj") and layer.moe.w13.shape == (4, 32, 32)
    m = torch.randn(3, 1, 32)
    got = layer.moe(m)
    # dense oracle: every expert on every token, weighted by the renormalized top-2 softmax
    probs = torch.softmax(layer.moe.router(m.view(3, 32)), -1)
    top = probs.topk(2, dim=-1)
    want = torch.zeros(3, 32)
    for e in range(4):
        gu = m.view(3, 32) @ layer.moe.w13[e]
        y = (torch.nn.functional.silu(gu[:, :16]) * gu[:, 16:]) @ layer.moe.w2[e]
        w = (top.values * (top.indices == e)).sum(-1) / top.values.sum(-1)
        want += w[:, None] * y
    torch.testing.assert_close(got.view(3, 32), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--experts", "4", "--top-k", "5"], "--top-k 5 must be in [1, --experts 4]"),
    (["--experts", "-1"], "--experts -1 must be >= 0"),
    (["--experts", "4", "--tp", "2"], "use --tp 1 with --experts"),
])
def test_bad_moe_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        torchair.demo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
