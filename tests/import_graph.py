"""The import graph of a package, read with ast, and the cycles in it.

Every import of one of the package's modules counts: at module level, inside functions and methods, and under
`if TYPE_CHECKING:`. `from pkg import name` imports pkg.name where that is a module, else pkg; either way
Python runs the packages above the module first, so from outside a package, importing its module imports the
package too (from inside, the package is already running). A type-only import that closes a cycle is still a cycle: the two modules still depend on
each other, so the fix is structural (a lower module, a dependency passed in, a string annotation).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    """One import: `source` imports `target` at `path:line`, at module level, in a function or type-only."""

    source: str
    target: str
    path: Path
    line: int
    where: str  # "module", "function" or "TYPE_CHECKING"
    loading: str = ""  # for a package run on the way to one of its modules: that module

    def __str__(self) -> str:
        on_the_way = f", loading {self.loading}" if self.loading else ""
        return f"{self.source} -> {self.target} ({self.path}:{self.line}, {self.where}{on_the_way})"


def module_name(root: Path, path: Path) -> str:
    """The dotted name of `path`, a .py file under `root` (the folder holding the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _places(tree: ast.Module) -> dict[int, str]:
    """For each node inside a function or under `if TYPE_CHECKING:`, which of the two (type-only wins)."""
    place: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for sub in ast.walk(node):
                place.setdefault(id(sub), "function")
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:  # the else branch runs
                for inner in ast.walk(sub):
                    place[id(inner)] = "TYPE_CHECKING"
    return place


def imports(root: Path, path: Path, modules: set[str]) -> list[Edge]:
    """Every import in `path` of a module in `modules`, with its line and where it sits."""
    name = module_name(root, path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    place = _places(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = []
    for node in ast.walk(tree):
        named: list[str] = []  # the modules the statement needs, by name
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + [base] * bool(base))
            named = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        where = place.get(id(node), "module")
        for target in dict.fromkeys(named):
            if target not in modules or target == name:
                continue
            edges.append(Edge(name, target, path.relative_to(root), node.lineno, where))
            parts = target.split(".")
            for parent in (".".join(parts[:end]) for end in range(1, len(parts))):
                if parent in modules and parent != name and not name.startswith(parent + "."):
                    edges.append(Edge(name, parent, path.relative_to(root), node.lineno, where, loading=target))
    return edges


def import_graph(root: Path, package: str) -> dict[str, list[Edge]]:
    """Each module of `package` (a folder under `root`) and the imports of the package's modules it makes."""
    files = {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}
    return {name: imports(root, path, set(files)) for name, path in files.items()}


def _components(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted({e.target for e in graph[start]})))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({e.target for e in graph[child]}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _shortest_cycle(graph: dict[str, list[Edge]], component: list[str]) -> list[Edge]:
    """A shortest cycle through the first module of `component`, as the imports that form it."""
    start, members = component[0], set(component)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target not in members or edge.target in came:
                    continue
                came[edge.target] = edge
                if edge.target == start:
                    route = [edge]
                    while route[0].source != start:
                        route.insert(0, came[route[0].source])
                    return route
                following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in its component {component}")


def find_cycles(graph: dict[str, list[Edge]]) -> list[list[Edge]]:
    """One shortest cycle for each group of modules that import each other, as its imports."""
    return [_shortest_cycle(graph, component) for component in _components(graph)]


def describe(graph: dict[str, list[Edge]], cycles: list[list[Edge]]) -> str:
    """The cycles, each with the modules and lines that form it, and every import inside its group."""
    lines = []
    for cycle in cycles:
        members = set(_component_of(graph, cycle[0].source))
        lines.append("cycle " + " -> ".join([e.source for e in cycle] + [cycle[0].source]) + ":")
        lines += [f"    {edge}" for edge in cycle]
        rest = [e for m in sorted(members) for e in graph[m] if e.target in members and e not in cycle]
        lines += [f"    also {edge}" for edge in rest]
    return "\n".join(lines)


def _component_of(graph: dict[str, list[Edge]], module: str) -> list[str]:
    return next(c for c in _components(graph) if module in c)


def top_package(module: str) -> str:
    """The part of `module` a layer names: `omrl.store.parts` -> `store`; a root module -> its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, list[Edge]], layers: list[set[str]], base: set[str]) -> list[Edge]:
    """Every import that goes up or sideways between `layers` (listed top first), or from `base` (the
    root modules every layer may use) into a layer. Imports inside one top-level package are free, and so
    are the package root's (omrl/__init__.py: type-only names for users)."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    rank.update({name: len(layers) for name in base})
    unknown = sorted({top_package(m) for m in graph if top_package(m) and top_package(m) not in rank})
    if unknown:
        raise AssertionError(f"packages in no layer (add them to the contract): {', '.join(unknown)}")
    wrong = []
    for edges in graph.values():
        for edge in edges:
            a, b = top_package(edge.source), top_package(edge.target)
            if not a or not b or a == b or edge.loading:  # a package run on the way: its module counts
                continue
            lower = rank[b] > rank[a]
            among_base = a in base and b in base
            if not (lower or among_base):
                wrong.append(edge)
    return wrong
