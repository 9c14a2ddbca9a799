"""The user guide's generated tables (docs/parity.md, docs/options.md) match the code's
registries (regenerate with ``python tools/gen_docs.py``). The tool is loaded by its path: it is a
developer tool outside the package."""
import importlib.util
import pathlib

import pytest

from torchair.base import parity as _parity
from torchair.configs import CompilerConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_tool():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "tools" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_tool()


def _block(key):
    text = (ROOT / gen_docs.PAGES[key]).read_text(encoding="utf-8")
    begin, end = gen_docs.MARKERS[key]
    assert begin in text and end in text, f"{gen_docs.PAGES[key]} lacks the {key} table markers"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def _rows(block):
    return [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in block.splitlines()[2:]]


def test_api_table_matches_the_registry():
    assert _block("api") == gen_docs.render_api_table()
    rows = _rows(_block("api"))
    assert [r[0].strip("`") for r in rows] == list(_parity.PUBLIC_API)
    assert {r[1] for r in rows} <= set(_parity.STATUSES)


def test_option_table_matches_the_registry():
    assert _block("options") == gen_docs.render_option_table()
    rows = _rows(_block("options"))
    registry = CompilerConfig.registry()
    assert [r[0].strip("`") for r in rows] == list(registry)
    for row in rows:
        assert row[2] == registry[row[0].strip("`")].effect


def test_check_passes_here_and_names_a_stale_page(tmp_path, capsys):
    assert gen_docs.main(["--check"]) == 0
    for rel in gen_docs.PAGES.values():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text(encoding="utf-8"), encoding="utf-8")
    options = tmp_path / gen_docs.PAGES["options"]
    options.write_text(options.read_text(encoding="utf-8").replace("| works |", "| gone |", 1),
                       encoding="utf-8")
    assert gen_docs.stale_pages(tmp_path) == [gen_docs.PAGES["options"]]
    assert gen_docs.main(["--check", "--root", str(tmp_path)]) == 1
    assert gen_docs.PAGES["options"] in capsys.readouterr().err
    assert gen_docs.update_pages(tmp_path) == [gen_docs.PAGES["options"]]
    assert gen_docs.stale_pages(tmp_path) == []


@pytest.mark.parametrize("name", [n for n, (s, _) in _parity.PUBLIC_API.items()
                                  if s != _parity.NOT_SUPPORTED])
def test_every_listed_api_resolves(name):
    assert _parity.resolve(name) is not None
