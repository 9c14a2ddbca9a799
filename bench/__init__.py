"""torchair's benchmarks, one module per benchmark, run from the repository root as modules::

    python -m bench.bench_decode_step --quick
    python -m bench.report --quick

Shared pieces: :mod:`bench.model` (the decoder step most benches time), ``bench._harness``
(machine description, interleaved timing, statistics, tables, JSON) and ``bench._profile`` (the
per-op table of ``torch.profiler``). See ``bench/README.md``.
"""
