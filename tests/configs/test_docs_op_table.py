"""The op table of docs/ops.md names every op of the library (TORCH_NPU_OPS) and nothing that
is not one: a new op without a row, or a row left behind by a renamed op, fails here."""
import pathlib
import re

import torch

import torchair.ops

OPS_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def _op_table() -> str:
    text = OPS_PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Op table\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `"))


def test_every_op_has_a_row_with_cpu_and_cuda_columns():
    table = _op_table()
    named = set(re.findall(r"`(?:torchair\.ops\.)?([a-z_0-9]+)`", table.split("\n| ")[0]))
    for row in table.splitlines():
        first_cell = row.split("|")[1]
        named |= set(re.findall(r"`(?:torchair\.ops\.)?([a-z_0-9]+)`", first_cell))
        assert len([c for c in row.split("|")[1:-1] if c.strip()]) == 4, row
    missing = sorted(set(torchair.ops.TORCH_NPU_OPS) - named)
    assert not missing, f"add docs/ops.md op-table rows for {missing}"
    stale = sorted(n for n in named if not hasattr(torch.ops.npu, n))
    assert not stale, f"docs/ops.md op-table rows name no op: {stale}"
