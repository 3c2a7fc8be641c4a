"""No omrl module imports itself back through others: every import counts (module level, inside functions,
type-only under `if TYPE_CHECKING:`); and the cycle finder finds the cycles planted in a small package."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import describe, find_cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycles():
    graph = import_graph(ROOT, "omrl")
    assert len(graph) > 100 and any(e.where == "TYPE_CHECKING" for edges in graph.values() for e in edges)
    cycles = find_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n{describe(graph, cycles)}"


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in {"pkg/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_finder_counts_imports_inside_functions_and_type_only_ones(tmp_path):
    _package(tmp_path, {
        "pkg/a.py": "import os\nimport pkg.b\n",
        "pkg/b.py": "def f():\n    from pkg import a\n    return a\n",  # closes a -> b -> a inside a function
        "pkg/c.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.d import D\nelse:\n"
                    "    import pkg.e\n",
        "pkg/d.py": "from . import c\n\nclass D: ...\n",  # relative: closes c -> d -> c, type-only
        "pkg/e.py": "from .sub.deep import x\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/deep.py": "x = 1\n",  # e -> sub.deep, and c -> e under the else branch: no cycle
    })
    graph = import_graph(tmp_path, "pkg")
    cycles = find_cycles(graph)
    assert [[(e.source, e.target, e.line, e.where) for e in cycle] for cycle in cycles] == [
        [("pkg.a", "pkg.b", 2, "module"), ("pkg.b", "pkg.a", 2, "function")],
        [("pkg.c", "pkg.d", 4, "TYPE_CHECKING"), ("pkg.d", "pkg.c", 1, "module")],
    ]
    assert {e.target: e.where for e in graph["pkg.c"]} == {"pkg.d": "TYPE_CHECKING", "pkg.e": "module"}
    assert {(e.target, e.loading) for e in graph["pkg.e"]} == {("pkg.sub.deep", ""), ("pkg.sub", "pkg.sub.deep")}
    text = describe(graph, cycles)
    assert "cycle pkg.a -> pkg.b -> pkg.a:" in text and "pkg/b.py:2, function" in text, text
    assert "pkg.c -> pkg.d (pkg/c.py:4, TYPE_CHECKING)" in text, text


def test_the_finder_reports_one_shortest_cycle_per_group_and_every_import_inside_it(tmp_path):
    _package(tmp_path, {
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "from pkg import c\n",
        "pkg/c.py": "class C:\n    def m(self):\n        from pkg.a import x\n        from pkg import b\n",
        "pkg/low.py": "from pkg import a\n",  # imports into the group, not part of it
    })
    graph = import_graph(tmp_path, "pkg")
    (cycle,) = find_cycles(graph)
    assert [(e.source, e.target) for e in cycle] == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a")]
    assert "also pkg.c -> pkg.b (pkg/c.py:4, function)" in describe(graph, [cycle])
    assert "pkg.low" not in describe(graph, [cycle])


def test_the_finder_counts_a_package_run_on_the_way_to_its_module(tmp_path):
    _package(tmp_path, {
        "pkg/low.py": "import pkg.sub.deep\n",  # runs pkg/sub/__init__.py first, which imports low back
        "pkg/sub/__init__.py": "from pkg.low import y\nfrom pkg.sub import deep\n",
        "pkg/sub/deep.py": "from pkg.sub import other\n",  # inside pkg.sub: its package is already running
        "pkg/sub/other.py": "",
    })
    graph = import_graph(tmp_path, "pkg")
    assert [str(e) for e in graph["pkg.sub.deep"]] == ["pkg.sub.deep -> pkg.sub.other (pkg/sub/deep.py:1, module)"]
    assert [[str(e) for e in cycle] for cycle in find_cycles(graph)] == [[
        "pkg.low -> pkg.sub (pkg/low.py:1, module, loading pkg.sub.deep)",
        "pkg.sub -> pkg.low (pkg/sub/__init__.py:1, module)"]]


def test_the_finder_finds_no_cycle_where_there_is_none(tmp_path):
    _package(tmp_path, {"pkg/a.py": "from pkg import b\nimport pkg\n", "pkg/b.py": "import json\n"})
    assert find_cycles(import_graph(tmp_path, "pkg")) == []
