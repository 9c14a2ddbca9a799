"""vllm-ascend's TorchAir decode path, as a script written for Ascend (examples/peer/
vllm_ascend_decode.py), under ``torchair run``: rope, SwiGLU, KV-cache scatter writes, W8A8 and
paged-BSH FIA through torch_npu, ``cache_compile(..., dynamic=True, fullgraph=True)`` per batch
size. Cold: one Dynamo graph per batch size (no recompile across steps with new lengths), equal
to eager bit for bit. Warm (a second process): zero Dynamo graphs, the same outputs, and the
rope's tensors stored on its module replayed."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "peer", "vllm_ascend_decode.py")


def _run(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--device", "cpu", SCRIPT,
                           "--cache-dir", str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=400, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_vllm_ascend_decode_script_cold_then_warm(tmp_path):
    cold, cold_log = _run(tmp_path)
    assert cold["equal_to_eager"] and cold["cos_embed_kept"], cold_log[-3000:]
    assert cold["graphs"] == 2, cold_log[-3000:]  # batch sizes 4 and 2; 3 steps each
    assert cold["device"] == "npu:0" and len(cold["outs"]) == 6
    assert "not cached" not in cold_log, cold_log[-3000:]
    entries = sorted(p.parent for p in (tmp_path / "cache").rglob("meta.json"))
    assert len(entries) == 2, entries
    warm, warm_log = _run(tmp_path)
    assert warm["graphs"] == 0, warm_log[-3000:]
    assert warm["equal_to_eager"] and warm["cos_embed_kept"], warm_log[-3000:]
    assert warm["outs"] == cold["outs"]
