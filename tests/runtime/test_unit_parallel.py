"""A static unit's C++ kernels run on several threads only from ``UNIT_PARALLEL_ELEMENTS``
elements on (``engines.unit_parallel_options``): Inductor's own rule (512 per thread) makes every
norm of a decode step a parallel region, which costs about what the kernel does."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

import torchair
from torchair.runtime import engines


def test_the_threshold_is_a_total_over_the_threads(monkeypatch):
    monkeypatch.delenv(engines.ENV_INDUCTOR_MIN_CHUNK, raising=False)
    total = engines.UNIT_PARALLEL_ELEMENTS
    assert engines.unit_parallel_options(2) == {"cpp.min_chunk_size": total // 2}
    assert engines.unit_parallel_options(1) == {"cpp.min_chunk_size": total}
    # many threads: Inductor's per-thread chunk is the larger, and stays
    many = total // inductor_config.cpp.min_chunk_size
    assert engines.unit_parallel_options(many) == {}
    assert engines.unit_parallel_options(4 * many) == {}
    with inductor_config.patch({"cpp.min_chunk_size": total}):  # already larger: left alone
        assert engines.unit_parallel_options(2) == {}


def test_the_users_inductor_setting_holds(monkeypatch):
    monkeypatch.setenv(engines.ENV_INDUCTOR_MIN_CHUNK, "512")
    assert engines.unit_parallel_options(2) == {}


@pytest.mark.inductor
def test_a_decode_sized_kernel_runs_on_one_thread(monkeypatch):
    """One Inductor build of a static unit on 2 threads: an RMS norm over 8 x 512 elements
    (parallel under Inductor's own rule) is compiled with the unit's threshold and has no
    parallel region; the result is eager's."""
    monkeypatch.delenv(engines.ENV_INDUCTOR_MIN_CHUNK, raising=False)
    from torch._inductor import compile_fx as inductor_compile_fx

    seen: list[int] = []
    real = inductor_compile_fx.compile_fx

    def spy(*args, **kwargs):
        seen.append(inductor_config.cpp.min_chunk_size)
        return real(*args, **kwargs)

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", spy)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def norm(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        config = torchair.CompilerConfig()
        config.experimental_config.tiling_schedule_optimize = True
        x, w = torch.randn(8, 512), torch.rand(512) + 0.5
        torch._dynamo.mark_static(x)
        compiled = torch.compile(norm, backend=torchair.get_npu_backend(compiler_config=config),
                                 dynamic=True, fullgraph=True)
        from torch._inductor.utils import run_and_get_cpp_code

        with torch.no_grad():
            got, code = run_and_get_cpp_code(compiled, x, w)
    finally:
        torch.set_num_threads(old)
    assert seen and all(v == engines.UNIT_PARALLEL_ELEMENTS // 2 for v in seen), seen
    torch.testing.assert_close(got, norm(x, w), rtol=1e-5, atol=1e-6)
    assert code and "#pragma omp parallel" not in code
