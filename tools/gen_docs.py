"""Regenerates the user guide's generated tables from the code's registries.

Two tables in ``docs/`` are not written by hand: TorchAir's public API and what each name does
here (``docs/parity.md``, from ``torchair.base.parity.PUBLIC_API``) and every ``CompilerConfig``
option with its default and effect (``docs/options.md``, from ``CompilerConfig.registry()``).
Each sits between a pair of HTML comment markers; this tool rewrites the text between them::

    python tools/gen_docs.py            # rewrite the tables in place
    python tools/gen_docs.py --check    # exit status 1, naming the pages, when one is out of date

It is a developer tool, not part of the package (``tools/`` is not a package and nothing in
``torchair/`` imports it), so it may read torchair's private registries. The tests load it by
path (``tests/configs/test_docs_tables.py``) and fail when a page and the registries disagree.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing torchair

from torchair.base.parity import PUBLIC_API  # noqa: E402
from torchair.configs import CompilerConfig  # noqa: E402

__all__ = ["MARKERS", "PAGES", "render_api_table", "render_option_table", "render_page",
           "stale_pages", "update_pages", "main"]

MARKERS = {"api": ("<!-- parity-api:begin -->", "<!-- parity-api:end -->"),
           "options": ("<!-- parity-options:begin -->", "<!-- parity-options:end -->")}
PAGES = {"api": "docs/parity.md", "options": "docs/options.md"}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_api_table() -> str:
    """One row per public name of TorchAir: name | status | note."""
    rows = ["| TorchAir API | here | note |", "|---|---|---|"]
    rows += [f"| `{name}` | {status} | {_cell(note)} |" for name, (status, note) in
             PUBLIC_API.items()]
    return "\n".join(rows)


def render_option_table() -> str:
    """One row per option of ``CompilerConfig``: option | default | here | why / what."""
    rows = ["| option | default | here | note |", "|---|---|---|---|"]
    for name, opt in CompilerConfig.registry().items():
        note = opt.doc if opt.effect == "works" else opt.why
        rows.append(f"| `{name}` | `{opt.default!r}` | {opt.effect} | {_cell(note)} |")
    return "\n".join(rows)


_RENDERERS: dict[str, Callable[[], str]] = {"api": render_api_table,
                                            "options": render_option_table}


def render_page(text: str, key: str) -> str:
    """``text`` with the ``key`` table between its markers regenerated; ValueError without them."""
    begin, end = MARKERS[key]
    if begin not in text or end not in text:
        raise ValueError(f"{PAGES[key]} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{_RENDERERS[key]()}\n{end}{tail}"


def stale_pages(root: Path = ROOT) -> list[str]:
    """The pages (relative to ``root``) whose generated tables differ from the registries."""
    stale = []
    for key, rel in PAGES.items():
        text = (root / rel).read_text(encoding="utf-8")
        if render_page(text, key) != text:
            stale.append(rel)
    return stale


def update_pages(root: Path = ROOT) -> list[str]:
    """Rewrites the generated tables under ``root``; returns the pages that changed."""
    changed = []
    for key, rel in PAGES.items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        new = render_page(text, key)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit status 1 when a page is out of date")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = p.parse_args(argv)
    if args.check:
        stale = stale_pages(args.root)
        for rel in stale:
            print(f"{rel} is out of date: run python tools/gen_docs.py", file=sys.stderr)
        return 1 if stale else 0
    for rel in update_pages(args.root):
        print(f"updated {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
