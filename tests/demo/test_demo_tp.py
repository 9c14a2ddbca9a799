"""``torchair demo --tp N``: the decoder split Megatron-style over N gloo ranks (started by
torch.distributed.run) generates the same tokens as the unsharded decoder, eager and compiled, with
the all-reduces inside the launch unit. Every multi-process run is bounded (process-group timeout
``$TORCHAIR_DIST_TIMEOUT``, subprocess timeout)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import torchair.demo
from torchair.demo.model import Decoder, DemoConfig, shard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--tp", "2", "--steps", "4", "--batch", "1", "--layers", "1", "--hidden", "64",
         "--heads", "4", "--kv-heads", "2", "--vocab", "64", "--prompt-len", "3",
         "--no-progress"]


def test_tp2_tokens_equal_tp1_collectives_inside_the_launch_unit(tmp_path):
    path = tmp_path / "tp.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHAIR_DIST_TIMEOUT="60")
    done = subprocess.run([sys.executable, "-m", "torchair", "demo", *SMALL, "--device", "cpu",
                           "--json", str(path)], capture_output=True, text=True, timeout=180,
                          env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "OK: tokens equal TP=1's exactly" in out and "all 2 ranks agree" in out
    assert "collectives: all_reduce x2 inside the launch unit (gloo" in out
    assert "graph TP ms/step" in out and "fx engine (the --tp default" in out
    assert out.count("torchair demo --tp 2:") == 1  # only rank 0 prints
    result = json.loads(path.read_text())
    assert result["ok"] and result["tp"] == 2 and result["backend"] == "gloo"
    assert result["build_static"] and result["recompiles"] == 0
    (row,) = result["rows"]
    assert row["equal_tp1"] and row["ranks_agree"] and row["tokens_equal"]
    assert row["graph_tokens"] == row["eager_tokens"] == row["tp1_tokens"]
    assert len(row["per_rank_graph_ms"]) == 2
    assert row["graph_ms"] == max(row["per_rank_graph_ms"])


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3"], "--tp 3: --heads 8 is not divisible by 3"),
    (["--tp", "4"], "--tp 4: --kv-heads 2 is not divisible by 4"),
    (["--tp", "2", "--intermediate", "99"], "--tp 2: --intermediate 99 is not divisible by 2"),
    (["--tp", "0"], "--tp must be >= 1"),
])
def test_tp_that_does_not_divide_is_an_argument_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:  # checked before any rank starts
        torchair.demo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_shards_put_together_are_the_full_model():
    torch.manual_seed(0)
    cfg = DemoConfig(layers=1, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=32)
    full = Decoder(cfg)
    parts = [shard(full, 2, rank) for rank in range(2)]
    assert all(p.cfg.tp == 2 and p.cfg.local_kv_heads == 1 for p in parts)
    layer = full.layers[0]
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):  # column-parallel
        cat = torch.cat([getattr(p.layers[0], name).weight for p in parts], dim=0)
        assert torch.equal(cat, getattr(layer, name).weight), name
    for name in ("o_proj", "down_proj"):  # row-parallel
        cat = torch.cat([getattr(p.layers[0], name).weight for p in parts], dim=1)
        assert torch.equal(cat, getattr(layer, name).weight), name
    for p in parts:  # replicated
        assert torch.equal(p.embed, full.embed) and torch.equal(p.lm_head.weight,
                                                                full.lm_head.weight)
        assert torch.equal(p.cos_table, full.cos_table)


@pytest.mark.parametrize("ok, code", [(True, 0), (False, 1)])
def test_exit_status_is_rank_0_verdict(monkeypatch, ok, code):
    """The parent exits 1 when rank 0 reports other tokens (and when it reports nothing)."""
    from torch.distributed import run as torchrun

    def fake_main(argv):
        result = argv[argv.index("--tp-worker") + 1]
        assert argv[argv.index("--nproc-per-node") + 1] == "2"
        with open(result, "w", encoding="utf-8") as f:
            json.dump({"ok": ok}, f)

    monkeypatch.setattr(torchrun, "main", fake_main)
    assert torchair.demo.main(["--tp", "2", "--device", "cpu"]) == code
    monkeypatch.setattr(torchrun, "main", lambda argv: None)
    assert torchair.demo.main(["--tp", "2", "--device", "cpu"]) == 1
