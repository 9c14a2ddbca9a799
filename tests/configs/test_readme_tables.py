"""The README's parity tables match the code's registries (regenerate with
``python -m torchair._readme_tables``)."""
import os

import pytest

from torchair.base import parity as _parity, _readme_tables
from torchair.configs import CompilerConfig

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def _block(key):
    text = open(README, encoding="utf-8").read()
    begin, end = _readme_tables.MARKERS[key]
    assert begin in text and end in text, f"README lacks the {key} table markers"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def _rows(block):
    return [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in block.splitlines()[2:]]


def test_api_table_matches_the_registry():
    assert _block("api") == _readme_tables.render_api_table()
    rows = _rows(_block("api"))
    assert [r[0].strip("`") for r in rows] == list(_parity.PUBLIC_API)
    assert {r[1] for r in rows} <= set(_parity.STATUSES)


def test_option_table_matches_the_registry():
    assert _block("options") == _readme_tables.render_option_table()
    rows = _rows(_block("options"))
    registry = CompilerConfig.registry()
    assert [r[0].strip("`") for r in rows] == list(registry)
    for row in rows:
        assert row[2] == registry[row[0].strip("`")].effect


@pytest.mark.parametrize("name", [n for n, (s, _) in _parity.PUBLIC_API.items()
                                  if s != _parity.NOT_SUPPORTED])
def test_every_listed_api_resolves(name):
    assert _parity.resolve(name) is not None
