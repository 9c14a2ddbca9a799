"""``torchair run --nproc-per-node 2``: two gloo ranks started by torch.distributed.run, each
running an Ascend-style script under the emulation. Every run is bounded (subprocess timeout,
process-group timeout)."""
import os
import re
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TP_SCRIPT = os.path.join(ROOT, "examples", "peer", "tp_script.py")


def _torchair_run(*args, cwd, timeout_s="60", spelling="--nproc-per-node", **env_extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHAIR_DIST_TIMEOUT=timeout_s, **env_extra)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "torchair", "run", spelling, "2",
                           "--device", "cpu", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd, check=False)
    return done, time.monotonic() - start


def test_two_ranks_run_the_tensor_parallel_example(tmp_path):
    done, _ = _torchair_run(TP_SCRIPT, cwd=tmp_path, TORCHAIR_LOG_LEVEL="DEBUG")
    assert done.returncode == 0, done.stderr[-3000:]
    # each rank let gloo's workers finish before Python finalized (torchair.distributed.quiesce:
    # without it a rank aborted now and then after printing its result)
    assert done.stderr.count("gloo workers quiet after") == 2, done.stderr[-3000:]
    found = sorted(re.findall(r"rank (\d)/2: npu=(\d) device=(\w+) sum=(\S+) matches_full=(\w+) "
                              r"compiled_matches=(\w+)", done.stdout))
    assert [row[:3] for row in found] == [("0", "0", "cpu"), ("1", "1", "cpu")], done.stdout
    # eager collectives and the torchair-compiled TP layer (all_reduce inside the graph)
    assert all(row[4] == "True" and row[5] == "True" for row in found), done.stdout
    assert found[0][3] == found[1][3]  # all_reduce: both ranks hold the same sum


def _write(tmp_path, body):
    script = tmp_path / "rank_script.py"
    script.write_text(textwrap.dedent("""\
        import os, time
        import torch, torch.distributed as dist, torch_npu
        torch.npu.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("hccl")
        """) + textwrap.dedent(body))
    return str(script)


def test_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    script = _write(tmp_path, """\
        if dist.get_rank() == 1:
            raise ValueError("rank 1 gave up on purpose")
        dist.all_reduce(torch.ones(4, device="npu"))  # rank 1 never joins
        print("rank 0 passed the all_reduce", flush=True)
        """)
    done, elapsed = _torchair_run(script, cwd=tmp_path, spelling="--nproc_per_node")
    assert done.returncode != 0
    assert "ValueError: rank 1 gave up on purpose" in done.stderr
    assert "Root Cause" in done.stderr and "rank      : 1" in done.stderr  # launcher summary
    assert "passed the all_reduce" not in done.stdout
    assert elapsed < 60, elapsed


def test_a_rank_blocked_in_a_collective_times_out(tmp_path):
    # rank 1 hangs without closing its connections: only the process-group timeout
    # ($TORCHAIR_DIST_TIMEOUT, given to init_process_group by the emulation) frees rank 0
    script = _write(tmp_path, """\
        if dist.get_rank() == 1:
            time.sleep(100)
        dist.all_reduce(torch.ones(4, device="npu"))
        """)
    done, elapsed = _torchair_run(script, cwd=tmp_path, timeout_s="3")
    assert done.returncode != 0
    assert "rank      : 0" in done.stderr and "Root Cause" in done.stderr, done.stderr[-3000:]
    assert elapsed < 45, elapsed  # far below rank 1's 100 s sleep


def test_without_the_launcher_init_process_group_says_how_to_launch(tmp_path):
    script = tmp_path / "no_launcher.py"
    script.write_text("import torch.distributed as dist\nimport torch_npu\n"
                      "dist.init_process_group('hccl')\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-m", "torchair", "run", "--device", "cpu",
                           str(script)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "torchair run --nproc-per-node N" in done.stderr, done.stderr[-2000:]


def test_launch_arguments_are_checked(tmp_path, capsys):
    import pytest

    from torchair import cli

    script = tmp_path / "s.py"
    script.write_text("")
    for argv, message in ((["--nproc-per-node", "0"], "expected a number of ranks >= 1"),
                          (["--master-port", "29500"], "only used with --nproc-per-node N > 1")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["run", *argv, str(script)])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
