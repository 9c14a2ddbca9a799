"""``torchair.demo``: the Llama-style decoder demo generates the same tokens compiled as eagerly,
compiles once for all batch gears, and builds one static launch unit per gear."""
import json
import subprocess
import sys

import pytest
import torch

import torchair.demo
from torchair.demo import step as demo_step

TINY = ["--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "64",
        "--steps", "5", "--prompt-len", "3", "--no-progress"]


def _run(tmp_path, *extra):
    path = tmp_path / "demo.json"
    code = torchair.demo.main([*TINY, *extra, "--json", str(path)])
    return code, json.loads(path.read_text())


def _check_static_once(result, gears):
    assert result["tokens_equal"]
    assert all(r["tokens_equal"] for r in result["rows"])
    assert result["dynamo_compiles"] == 1 and result["recompiles"] == 0
    assert result["build_static"] and result["path"] == 4
    assert len(result["built_gears"]) == len(gears)
    for gear, size in zip(result["built_gears"], gears):
        assert f"L_tokens_[0]={size}" in gear and f"L_block_table_[0]={size}" in gear


def test_fx_engine_two_gears_tokens_equal_one_compile_static(tmp_path, capsys):
    code, result = _run(tmp_path, "--engine", "fx", "--batch", "1", "3")
    out = capsys.readouterr().out
    assert code == 0
    _check_static_once(result, [1, 3])
    assert result["engine"] == "fx"
    assert [r["batch"] for r in result["rows"]] == [1, 3]
    assert [len(r["graph_tokens"]) for r in result["rows"]] == [1, 3]
    assert all(len(seq) == 5 for r in result["rows"] for seq in r["graph_tokens"])
    assert "static build: yes" in out and "Dynamo compiles: 1   recompiles: 0" in out
    assert "OK: the compiled steps' tokens (graph and cached) equal eager's exactly" in out
    assert "eager ms/step" in out and "speedup" in out and "cached ms/step" in out
    for r in result["rows"]:  # the cache_compile step: its own tokens, one Dynamo trace in all
        assert r["cached_tokens_equal"] and r["cached_tokens"] == r["eager_tokens"]
        assert r["cached_x_floor"] == pytest.approx(r["cached_ms"] / r["floor_ms"])
    assert sum(r["cached_dynamo_graphs"] for r in result["rows"]) == 1
    assert "floor ms" in out and "graph x floor" in out
    assert result["read_bandwidth"]["gb_per_s"] > 0
    for r in result["rows"]:  # the floor, and each variant as a multiple of it (no timing bound)
        assert r["floor_ms"] > 0 and r["gemv_ms"] > 0 and r["kv_bytes_per_step"] > 0
        assert r["eager_x_floor"] == pytest.approx(r["eager_ms"] / r["floor_ms"])
        assert r["graph_x_floor"] == pytest.approx(r["graph_ms"] / r["floor_ms"])


def test_one_batch_size_is_mark_static_without_gears(tmp_path, capsys):
    code, result = _run(tmp_path, "--engine", "fx", "--batch", "2", "--no-rope",
                        "--no-cache-compile")
    assert code == 0
    assert "cached_ms" not in result["rows"][0]
    assert result["tokens_equal"] and result["build_static"] and result["recompiles"] == 0
    assert result["built_gears"] == []
    assert "built gears: none (one batch size)" in capsys.readouterr().out


def _off_by_one(monkeypatch, name):
    """Make ``demo_step.<name>`` build a step whose tokens are all off by one."""
    real = getattr(demo_step, name)

    def wrong(*args, **kwargs):
        step = real(*args, **kwargs)
        return lambda *a, **k: (step(*a, **k) + 1) % 64

    monkeypatch.setattr(demo_step, name, wrong)


def test_mismatch_exits_1_with_a_clear_line(tmp_path, monkeypatch, capsys):
    """A compiled step that returns other tokens must fail the demo."""
    _off_by_one(monkeypatch, "compile_step")
    code, result = _run(tmp_path, "--engine", "fx", "--batch", "1", "2")
    assert code == 1 and not result["tokens_equal"]
    assert result["rows"][0]["first_mismatch"] == [0, 0]
    out = capsys.readouterr().out
    assert "MISMATCH: the tokens differ from eager's: graph at batch sizes [1, 2]" in out
    assert all(r["cached_tokens_equal"] for r in result["rows"])  # cache_compile's own step


def test_cached_step_mismatch_also_fails_the_demo(tmp_path, monkeypatch, capsys):
    _off_by_one(monkeypatch, "cache_compile_step")
    code, result = _run(tmp_path, "--engine", "fx", "--batch", "2")
    assert code == 1 and not result["tokens_equal"]
    assert result["rows"][0]["tokens_equal"] and not result["rows"][0]["cached_tokens_equal"]
    assert "MISMATCH: the tokens differ from eager's: cached at batch sizes [2]" in \
        capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--batch", "2", "2"], "distinct positive sizes"),
    (["--batch", "0", "2"], "distinct positive sizes"),
    (["--hidden", "60", "--heads", "8"], "multiple of heads"),
    (["--steps", "1"], "--steps must be >= 2"),
    (["--threads", "0"], "--threads must be >= 1"),
])
def test_bad_arguments_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        torchair.demo.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_device_cuda_without_a_gpu_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as exc:
        torchair.demo.main(["--device", "cuda"])
    assert exc.value.code == 2 and "CUDA is not available" in capsys.readouterr().err


def test_python_dash_m_torchair_demo_help():
    out = subprocess.run([sys.executable, "-m", "torchair.demo", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--batch" in out.stdout and "--engine" in out.stdout


@pytest.mark.inductor
def test_default_engine_two_gears(tmp_path):
    """The default (Inductor) engine: one Dynamo compile, two static gear units, same tokens."""
    code, result = _run(tmp_path, "--batch", "1", "2")
    assert code == 0
    _check_static_once(result, [1, 2])
    assert result["engine"] == "inductor-cpp"  # static CPU units: C++ wrapper


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_two_gears_replay_cuda_graphs(tmp_path):
    code, result = _run(tmp_path, "--device", "cuda", "--batch", "1", "2")
    assert code == 0
    _check_static_once(result, [1, 2])
    assert "CUDA graph" in result["launch"]
