"""``readable_cache``: a cache entry described in text (metadata, key, guards, inputs, code).

The TorchAir tool for looking into a ``cache_compile`` entry; it reads the entry through the
store's checks, so a broken or unsafe entry raises as it would for a warm start.
"""
from __future__ import annotations

import json
import os

from torchair.inference import _cache_store as store
from torchair.runtime import engines

__all__ = ["readable_cache"]


def readable_cache(cache_bin: str | os.PathLike, print_output: bool = True,
                   file: str | os.PathLike | None = None) -> str:
    """Describe a cache entry: metadata, key parts, guards, graph inputs and the graph's code.

    ``cache_bin`` is an entry directory (or a file in it). The text is printed when
    ``print_output``, written to ``file`` when given, and returned.
    """
    import pathlib

    path = pathlib.Path(cache_bin)
    entry = path if path.is_dir() else path.parent
    files = store.read_entry(entry)
    if files is None:
        raise FileNotFoundError(f"readable_cache: no cache entry at {entry}")
    meta = json.loads(files["meta.json"])
    lines = [f"cache entry {entry}", f"  function: {meta['name']}  (format {meta['format']}, "
             f"key {meta['key_hash']}, ge_cache={meta['ge_cache']})", "  key:"]
    lines += [f"    {k}: {v}" for k, v in meta["key"].items()]
    lines.append("  traced source files:")
    lines += [f"    {name}  sha256 {digest[:16]}" for name, digest in meta["traced_files"].items()]
    lines.append(f"  guards ({len(meta['guards'])}, checked on every warm call unless "
                 f"advisory):")
    for g in meta["guards"]:
        text = "; ".join(g.get("code", [])) if "state" not in g else json.dumps(g["state"])
        lines.append(f"    {g['kind']}: {text}" + (f"  [advisory: {g['advisory']}]"
                                                    if g.get("advisory") else ""))
    for source, attr, value in meta.get("writes", []):
        value = (f"graph output {value['out']}" if isinstance(value, dict) and "out" in value
                 else f"graph input {value['in']}" if isinstance(value, dict) else repr(value))
        lines.append(f"    after each call: {source}.{attr} = {value}  (as Dynamo replays it)")
    lines.append("  graph inputs (Dynamo source -> IR Data):")
    for source, info in zip(meta["sources"], meta["inputs"]):
        lines.append(f"    {source}  ->  {info['kind']} {info['dtype']}{list(info['shape'])}"
                     + (" (mutated in place)" if info.get("mutated") else ""))
    unit = meta["unit"]
    lines.append(f"  launch unit: {unit['kind']}, {meta['report']['launch']}"
                 + (f", engine {unit.get('engine')}" if unit.get("engine") else ""))
    for name in sorted(n for n in files if n.endswith(engines.LIBRARY)):
        lines.append(f"  built: {name} ({len(files[name])} bytes, AOTInductor shared library, "
                     f"vec_isa {meta.get('vec_isa')})")
    for name in sorted(n for n in files if n.endswith("code.py")):
        lines.append(f"  code ({name}):")
        lines += ["    " + line for line in files[name].decode().splitlines()]
    text = "\n".join(lines) + "\n"
    if file is not None:
        pathlib.Path(file).write_text(text, encoding="utf-8")
    if print_output:
        print(text, end="")  # noqa: T201 - printing is this function's purpose
    return text
