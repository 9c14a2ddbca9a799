"""The test tree imports its files by basename (no packages, pytest's default import mode): two
test files of one name in different folders break collection ("import file mismatch") of
whichever comes second, e.g. on the GPU machine's run of the `cuda` tests."""
import collections
import pathlib


def test_test_file_names_are_unique():
    root = pathlib.Path(__file__).parent
    names = collections.defaultdict(list)
    for path in root.rglob("*.py"):
        names[path.name].append(str(path.relative_to(root)))
    twice = {n: p for n, p in names.items() if len(p) > 1 and n not in ("__init__.py",
                                                                          "conftest.py")}
    assert not twice, f"rename one of each: {twice}"
