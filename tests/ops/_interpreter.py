"""Re-run a Triton test module under Triton's interpreter in a child pytest.

Triton picks compiled vs interpreted when it decorates a kernel, so ``TRITON_INTERPRET=1`` must be
set before triton is imported; when this process imported it without (e.g. pytest started with a
GPU or with the variable unset), the module's interpreter tests run in a child process instead.
"""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_interpreted(module_file: str, min_passed: int) -> None:
    """Run ``module_file``'s non-subprocess, non-cuda tests interpreted; assert they passed."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(pathlib.Path(module_file).resolve()),
         "-k", "not subprocess and not cuda"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    tail = res.stdout[-4000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= min_passed, tail  # the tests really ran
