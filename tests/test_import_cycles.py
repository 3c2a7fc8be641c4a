"""The package's layout: no omrl module imports itself back through others (every import counts: module
level, inside functions, type-only under `if TYPE_CHECKING:`), and the cycle finder finds the cycles planted
in a small package; no module over MAX_LINES lines without its reason in LONG_MODULES."""

from __future__ import annotations

from pathlib import Path

from tests.import_graph import describe, find_cycles, import_graph, layer_violations

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
# Modules over MAX_LINES lines, each with why it stays whole for now. A module that grows past the limit
# needs a split or an entry here; an entry whose module is back under the limit is removed.
LONG_MODULES = {
    "omrl/store/search.py": "one search semantics (its docstring's one definition): the per-part index, its builder "
                            "and the full scan standing in where a part has none must tokenise and match exactly "
                            "alike; kept in one module so the three cannot drift apart",
    "omrl/view/data.py": "one class, the viewer's StoreReader: each page's query is a method on the same snapshot of "
                         "the parts and the same connection pool, and a class's methods do not split over modules",
    "omrl/formats/otel.py": "one format both ways, as FORMATS and EXPORTERS load it by name: convert and "
                            "export_records share the span-name and attribute tables a round trip must agree on "
                            "(reading OTLP spans is otel_spans.py already)",
    "omrl/curate/filters.py": "one filter pipeline: a small class per step, applied in the fixed order its "
                              "docstring gives, each step's reason reported beside the others",
    "omrl/store/readers.py": "the one reading layer for record files: every kind's reader (JSONL, JSON, CSV, "
                             "Parquet) raises the same located, one-line errors through shared sniffing and error "
                             "helpers",
    "omrl/store/store.py": "one class, the Store facade: a public method per store operation (create, staged, "
                           "append, check, repair, compact, select, sql), each delegating to parts, commit, check "
                           "and query; its length is its API's",
}


def test_no_import_cycles():
    graph = import_graph(ROOT, "omrl")
    assert len(graph) > 100 and any(e.where == "TYPE_CHECKING" for edges in graph.values() for e in edges)
    cycles = find_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n{describe(graph, cycles)}"


# The layers of omrl, top first: a package imports only from layers below its own (never up, never sideways).
# Root modules (BASE) are the shared floor every layer may use.
LAYERS = [
    {"__main__"},
    {"cli"},
    {"testing"},          # fakes and synthetic data for tests, benchmarks and the demo
    {"view"},             # the browser viewer (shows training runs too)
    {"study"},            # studies: methods x seeds x conditions, held-out sets new by fingerprint, the test ledger
    {"train"},            # trainers, the data bridge, iterate, the demo
    {"curate"},           # filters, dedupe, augment (read annotations)
    {"annotate", "formats", "report"},
    {"rollout"},          # the agent loop, the episode runner and pool, executors
    {"serve"},            # a local model server, supervised like an engine
    {"policies"},
    {"models"},           # tiny and real models by name
    {"tasks"},
    {"envs"},
    {"llm"},              # the one OpenAI-compatible client and its endpoint limits
    {"sandbox"},
    {"store"},
    {"schema"},
]
BASE = {"errors", "config", "plugins", "progress", "shipped"}
MAX_ROOT_MODULES = 8


def test_every_import_goes_down_the_layers():
    graph = import_graph(ROOT, "omrl")
    wrong = layer_violations(graph, LAYERS, BASE)
    assert not wrong, "imports against the layers:\n" + "\n".join(f"  {edge}" for edge in wrong)


def test_the_package_root_holds_few_modules():
    modules = sorted(p.name for p in (ROOT / "omrl").glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, f"{len(modules)} modules at omrl/: {modules}"
    assert {p.removesuffix(".py") for p in modules} <= BASE | {"__init__", "__main__"}


def test_the_layer_check_finds_an_upward_and_a_sideways_import(tmp_path):
    _package(tmp_path, {"pkg/low/__init__.py": "", "pkg/low/a.py": "def f():\n    from pkg.high import b\n",
                        "pkg/high/__init__.py": "", "pkg/high/b.py": "from pkg.low import a\n",
                        "pkg/side/__init__.py": "from pkg.high import b\n", "pkg/util.py": "from pkg.low import a\n"})
    graph = import_graph(tmp_path, "pkg")
    wrong = {(e.source, e.target) for e in layer_violations(graph, [{"high", "side"}, {"low"}], {"util"})}
    assert wrong == {("pkg.low.a", "pkg.high.b"), ("pkg.side", "pkg.high.b"), ("pkg.util", "pkg.low.a")}


def test_no_module_is_long_without_a_reason():
    lines = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted((ROOT / "omrl").rglob("*.py"))}
    long = {path: n for path, n in lines.items() if n > MAX_LINES}
    unexplained = [f"{path} ({n} lines)" for path, n in long.items() if path not in LONG_MODULES]
    assert not unexplained, f"over {MAX_LINES} lines with no reason in LONG_MODULES: {', '.join(unexplained)}"
    stale = [f"{path} ({lines.get(path, 'gone')})" for path in LONG_MODULES if path not in long]
    assert not stale, f"no longer over {MAX_LINES} lines: remove from LONG_MODULES: {', '.join(stale)}"


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
