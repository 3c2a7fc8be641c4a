"""No function in omrl/ takes or returns a trajectory, turn or annotation row as a bare dict: a parameter named
row/rows/trajectory/trajectories/annotation/annotations/turn/turns, and the return of a function named *_row or
*_rows, is annotated with a row type (omrl.schema.rows) instead of `dict[str, Any]`, `dict`, `Dict[str, Any]`
or a list of those. A record that is not such a row (a CSV line, a task, a JSON object) has a name saying what
it is instead."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "omrl"

ROW_NAMES = frozenset({"row", "rows", "trajectory", "trajectories", "annotation", "annotations", "turn", "turns"})
BARE_DICTS = frozenset({"dict", "Dict", "dict[str, Any]", "Dict[str, Any]"})


def is_bare_dict(annotation: ast.expr | None) -> bool:
    """Whether an annotation is a bare dict, a list or sequence of them, or one of those or None."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return is_bare_dict(annotation.left) or is_bare_dict(annotation.right)
    text = ast.unparse(annotation)
    if text in BARE_DICTS:
        return True
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).split(".")[-1] in {
        "list", "List", "Sequence", "Iterable", "Iterator", "Generator", "Optional",
    }:
        inner = annotation.slice
        first = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
        return is_bare_dict(first)
    return False


def bare_row_signatures(path: Path) -> list[str]:
    """`file:line function(part)` for each row parameter or row return typed as a bare dict in one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(PACKAGE.parent)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None and arg.arg in ROW_NAMES and is_bare_dict(arg.annotation):
                found.append(f"{where}:{node.lineno} {node.name}({arg.arg})")
        if node.name.endswith(("_row", "_rows")) and is_bare_dict(node.returns):
            found.append(f"{where}:{node.lineno} {node.name} -> {ast.unparse(node.returns)}")
    return found


def test_the_check_sees_a_bare_dict_row():
    assert is_bare_dict(ast.parse("list[dict[str, Any]]", mode="eval").body)
    assert is_bare_dict(ast.parse("'dict[str, Any] | None'", mode="eval").body)
    assert not is_bare_dict(ast.parse("TrajectoryRow", mode="eval").body)
    assert not is_bare_dict(ast.parse("dict[str, float]", mode="eval").body)


def test_no_row_is_a_bare_dict():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += bare_row_signatures(path)
    assert found == [], "type these with omrl.schema.rows (or rename a non-row):\n" + "\n".join(found)


def test_the_viewers_annotation_is_a_cut_of_the_annotation_row():
    from omrl.schema.rows import AnnotationRow
    from omrl.view.data import ShownAnnotation

    row, shown = typing.get_type_hints(AnnotationRow), typing.get_type_hints(ShownAnnotation)
    assert shown == {name: row[name] for name in shown}
