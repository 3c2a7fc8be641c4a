"""Candidate bugs for a package's source: omrl's own procedural modifiers (one small change to one function), and
functions reverted to an earlier release's body; tasks.py keeps a candidate only when the tests catch it.

A modifier looks at one function's AST and proposes changes of one expression or statement; the change is made
on the source text (only that expression's characters, or that statement's lines), so the fix is a small diff.
A revert replaces the lines of a function's statements (its docstring aside) with the earlier release's.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv}


@dataclass(frozen=True)
class Candidate:
    """One proposed bug: which file and function, which modifier, and the file's text with the bug in it."""

    path: str
    function: str
    modifier: str
    buggy: str
    original: str

    @property
    def id(self) -> str:
        return hashlib.sha256(f"{self.path}\0{self.function}\0{self.modifier}\0{self.buggy}".encode()).hexdigest()[:12]

    def bug_patch(self) -> str:
        return unified_diff(self.path, self.original, self.buggy)

    def fix_patch(self) -> str:
        return unified_diff(self.path, self.buggy, self.original)

    def fix_edit(self) -> dict[str, str]:
        """The fix as one str_replace edit: the smallest run of whole lines around the change that occurs once."""
        old_lines, new_lines = self.buggy.splitlines(keepends=True), self.original.splitlines(keepends=True)
        start = 0
        while start < min(len(old_lines), len(new_lines)) and old_lines[start] == new_lines[start]:
            start += 1
        end_old, end_new = len(old_lines), len(new_lines)
        while end_old > start and end_new > start and old_lines[end_old - 1] == new_lines[end_new - 1]:
            end_old, end_new = end_old - 1, end_new - 1
        for extra in range(0, 50):
            lo, hi_old, hi_new = max(0, start - extra), end_old + extra, end_new + extra
            old = "".join(old_lines[lo:hi_old])
            if old and self.buggy.count(old) == 1:
                return {"path": self.path, "old": old, "new": "".join(new_lines[lo:hi_new])}
        return {"path": self.path, "old": self.buggy, "new": self.original}


def unified_diff(path: str, before: str, after: str) -> str:
    """A git-style unified diff of one file (a/PATH b/PATH), as SWE-bench's patch fields are."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}")
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return f"diff --git a/{path} b/{path}\n{text}" if text else ""


# ------------------------------------------------------------------------------------------ modifiers

Change = tuple[ast.AST, str]  # the node whose source is replaced, and the replacement text


def _flip_comparison(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            changed = ast.Compare(node.left, [_FLIP[type(node.ops[0])]()], node.comparators)
            yield node, ast.unparse(changed)


def _off_by_one(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 16:
            yield node, str(node.value + 1)
            if node.value > 0:
                yield node, str(node.value - 1)


def _swap_bool_op(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.BoolOp):
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield node, ast.unparse(ast.BoolOp(other, node.values))


def _swap_arithmetic(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            yield node, ast.unparse(ast.BinOp(node.left, _ARITH[type(node.op)](), node.right))


def _negate_condition(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
            yield node.test, f"not ({ast.unparse(node.test)})"


def _flip_boolean(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, str(not node.value)


def _remove_statement(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or len(body) < 2:
            continue
        for statement in body:
            if isinstance(statement, (ast.Assign, ast.AugAssign, ast.Expr)) and not (
                    isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)):
                yield statement, "pass"


def _swap_arguments(function: ast.AST) -> Iterator[Change]:
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
            args = [node.args[1], node.args[0], *node.args[2:]]
            yield node, ast.unparse(ast.Call(node.func, args, node.keywords))


MODIFIERS: dict[str, Callable[[ast.AST], Iterator[Change]]] = {
    "flip_comparison": _flip_comparison, "off_by_one": _off_by_one, "swap_bool_op": _swap_bool_op,
    "swap_arithmetic": _swap_arithmetic, "negate_condition": _negate_condition, "flip_boolean": _flip_boolean,
    "remove_statement": _remove_statement, "swap_arguments": _swap_arguments,
}


def source_files(tree: Path) -> list[str]:
    """The package's own Python files (relative paths): not its tests, docs, examples or build scripts."""
    skip = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "build", ".git"}
    files = []
    for path in sorted(tree.rglob("*.py")):
        relative = path.relative_to(tree)
        if (skip & set(relative.parts[:-1]) or relative.name.startswith(("test_", "conftest"))
                or relative.name.endswith("_test.py") or relative.name in ("setup.py", "noxfile.py")
                or len(relative.parts) == 1 and relative.name.startswith(("_version", "version"))):
            continue
        files.append(str(relative))
    return files


def candidates(tree: Path, seed: int = 0, per_function: int = 2) -> list[Candidate]:
    """Every function of the package's source with up to `per_function` changes per modifier, in a seeded order."""
    rng = random.Random(seed)
    found = []
    for relative in source_files(tree):
        original = (tree / relative).read_text(encoding="utf-8", errors="replace")
        try:
            module = ast.parse(original)
        except SyntaxError:
            continue
        source = _Source(original)
        for function in ast.walk(module):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for name, modifier in MODIFIERS.items():
                changes = list(modifier(function))
                rng.shuffle(changes)
                for node, replacement in changes[:per_function]:
                    buggy = source.replace(node, replacement, function)
                    if buggy is not None and buggy != original:
                        found.append(Candidate(relative, function.name, name, buggy, original))
    rng.shuffle(found)
    return found


EARLIER_RELEASE = "earlier_release"


def reverted(tree: Path, earlier: Path) -> list[Candidate]:
    """A candidate per function whose statements (its docstring aside) differ in an earlier release's tree: those
    lines as the earlier release had them, re-indented to the function's place (functions matched by file and
    qualified name), in the order of the files and of the functions in them."""
    found = []
    for relative in source_files(tree):
        if not (earlier / relative).is_file():
            continue
        now, then = ((root / relative).read_text(encoding="utf-8", errors="replace") for root in (tree, earlier))
        try:
            new_functions, old_functions = _functions_by_name(ast.parse(now)), _functions_by_name(ast.parse(then))
        except SyntaxError:
            continue
        source, old_source = _Source(now), _Source(then)
        for name, function in new_functions.items():
            old = old_functions.get(name)
            new_body, old_body = _body(function), _body(old) if old is not None else []
            if not new_body or not old_body or _dump(new_body) == _dump(old_body):
                continue
            text = _reindented(old_source, old_body, source.indent(new_body[0]))
            buggy = source.replace_lines(new_body[0].lineno, new_body[-1].end_lineno, text)
            if buggy is not None and buggy != now:
                found.append(Candidate(relative, function.name, EARLIER_RELEASE, buggy, now))
    return found


def _functions_by_name(module: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function by its qualified name (Class.method, outer.<locals>.inner); a name defined twice: the last."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(module, "")
    return found


def _body(function: ast.AST) -> list[ast.stmt]:
    """The function's statements after its docstring, or [] when they do not start on lines of their own."""
    body = list(function.body)
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value,
                                                                                                 str):
        body = body[1:]
    if not body or body[0].lineno == function.lineno or (len(body) < len(function.body)
                                                         and body[0].lineno == function.body[0].end_lineno):
        return []
    return body


def _dump(statements: list[ast.stmt]) -> str:
    return "\n".join(ast.dump(statement) for statement in statements)


def _reindented(source: _Source, statements: list[ast.stmt], indent: str) -> str:
    """Those statements' whole lines, the first one's indentation replaced by `indent` on each line that starts
    with it (other lines, such as a string's continuation, kept as they are)."""
    start, end = source.offsets[statements[0].lineno - 1], source.offsets[statements[-1].end_lineno]
    text = source.data[start:end].decode("utf-8", errors="replace")
    prefix = source.indent(statements[0])
    if prefix == indent:
        return text
    return "".join(indent + line[len(prefix):] if line.startswith(prefix) else line
                   for line in text.splitlines(keepends=True))


class _Source:
    """One file's text, its UTF-8 bytes and line offsets, computed once for all the changes proposed in it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        # where each line starts, in bytes (AST columns are UTF-8 bytes), lines ending as Python's tokenizer ends
        # them: not at a form feed or the other breaks str.splitlines knows
        self.offsets = [0] + [m.end() for m in re.finditer(rb"\r\n|\r|\n", self.data)]
        if self.offsets[-1] != len(self.data):
            self.offsets.append(len(self.data))

    def replace(self, node: ast.AST, replacement: str, function: ast.AST) -> str | None:
        """The text with node's characters replaced (a statement keeps its indentation); None if the result
        breaks. Only `function` (node's function) is parsed again, unless that says the change breaks it: a
        function's text parses alone as it does in its file, the rest of the file being unchanged."""
        if getattr(node, "end_lineno", None) is None:
            return None
        start = self.offsets[node.lineno - 1] + node.col_offset
        end = self.offsets[node.end_lineno - 1] + node.end_col_offset
        segment = self.data[start:end].decode("utf-8", errors="replace")
        if "\n" in replacement or ("\n" in segment and isinstance(node, ast.expr)):
            replacement = f"({replacement})"
        new = replacement.encode("utf-8")
        changed = self.data[:start] + new + self.data[end:]
        first = min([function.lineno] + [d.lineno for d in function.decorator_list])
        low, high = self.offsets[first - 1], self.offsets[function.end_lineno]
        if low <= start <= end <= high:
            text = changed[low:high + len(new) - (end - start)].decode("utf-8", errors="replace")
            if _parses(text if function.col_offset == 0 else "if 1:\n" + text):
                return changed.decode("utf-8", errors="replace")
        text = changed.decode("utf-8", errors="replace")
        return text if _parses(text) else None


    def indent(self, statement: ast.stmt) -> str:
        """The text before a statement on its line (its indentation)."""
        start = self.offsets[statement.lineno - 1]
        return self.data[start:start + statement.col_offset].decode("utf-8", errors="replace")

    def replace_lines(self, start: int, end: int, text: str) -> str | None:
        """The text with lines start..end (1-based, inclusive) replaced by `text`, which keeps the last replaced
        line's ending; None if the result does not parse."""
        if not 1 <= start <= end < len(self.offsets):
            return None
        old = self.data[self.offsets[start - 1]:self.offsets[end]]
        ending = old[len(old.rstrip(b"\r\n")):]
        new = text.rstrip("\r\n").encode("utf-8") + ending
        changed = (self.data[:self.offsets[start - 1]] + new + self.data[self.offsets[end]:]).decode(
            "utf-8", errors="replace")
        return changed if _parses(changed) else None


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def problem_statement(package: str, failing: list[str], output: str) -> str:
    """The template task text, written from the failing tests (statement.py may have a model write it instead)."""
    shown = "\n".join(f"- {test}" for test in failing[:10]) + (f"\n- ... and {len(failing) - 10} more"
                                                               if len(failing) > 10 else "")
    excerpts = [line.strip() for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))][:5]
    details = "\n".join(excerpts)
    return (f"A change broke {package}: these tests of its own suite now fail:\n{shown}\n\n"
            f"What they report:\n{details}\n\nFind the bug in the package's source (not in the tests) and fix it "
            "so that the whole test suite passes again.")
