"""The README's parity tables, rendered from the code's registries.

``python -m torchair._readme_tables [README.md]`` rewrites the text between the
``<!-- parity-api:begin/end -->`` and ``<!-- parity-options:begin/end -->`` markers;
``tests/configs/test_readme_tables.py`` fails when the README and the registries disagree.
"""
from __future__ import annotations

import sys

__all__ = ["MARKERS", "render_api_table", "render_option_table", "update_readme"]

MARKERS = {"api": ("<!-- parity-api:begin -->", "<!-- parity-api:end -->"),
           "options": ("<!-- parity-options:begin -->", "<!-- parity-options:end -->")}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_api_table() -> str:
    """One row per public name of TorchAir: name | status | note."""
    from torchair.base.parity import PUBLIC_API

    rows = ["| TorchAir API | here | note |", "|---|---|---|"]
    rows += [f"| `{name}` | {status} | {_cell(note)} |" for name, (status, note) in
             PUBLIC_API.items()]
    return "\n".join(rows)


def render_option_table() -> str:
    """One row per option of ``CompilerConfig``: option | default | here | why / what."""
    from torchair.configs import CompilerConfig

    rows = ["| option | default | here | note |", "|---|---|---|---|"]
    for name, opt in CompilerConfig.registry().items():
        note = opt.doc if opt.effect == "works" else opt.why
        rows.append(f"| `{name}` | `{opt.default!r}` | {opt.effect} | {_cell(note)} |")
    return "\n".join(rows)


def _replace(text: str, key: str, table: str) -> str:
    begin, end = MARKERS[key]
    if begin not in text or end not in text:
        raise ValueError(f"README has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def update_readme(path: str = "README.md") -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = _replace(text, "api", render_api_table())
    text = _replace(text, "options", render_option_table())
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    update_readme(*sys.argv[1:2])
