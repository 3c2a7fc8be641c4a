"""The swe environment's candidate bugs (no sandbox needed): the fast search finds exactly what parsing the whole
file again for every change finds, on real source files (the standard library's) and on crafted layouts."""

from __future__ import annotations

import ast
import random
import shutil
import sysconfig
from pathlib import Path

import pytest

from omrl.envs.swe import bugs

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CRAFTED = {
    "pkg/shapes.py": (
        "import functools\n\n\nclass Box:\n    size = 3\n\n    @functools.lru_cache(maxsize=16)\n"
        "    def area(self, w, h=2):\n        if w > 0 and h > 0:\n            return w * h\n        return 0\n\n"
        "    class Inner:\n        def grow(self, n):\n            total = 0\n            for i in range(n):\n"
        "                total += i % 3\n            return total\n\n\n"
        "@(\n    functools.cache)\ndef cached(x):\n    return x + 1 if x < 10 else x - 1\n\n\n"
        "def multi(a, b):\n    value = (a +\n             b)\n    return f\"{value!r:>{a + 1}}\" if value != a else \"é\"\n"),
    "pkg/tabs.py": "def f(x):\n\tif x == 1:\n\t\treturn True\n\treturn x in (1, 2)\n",
    "pkg/crlf.py": "def g(x):\r\n    y = x + 1\r\n    return y < 4\r\n",
    "pkg/formfeed.py": "def h(x):\n    return x >= 2\n\x0c\ndef k(x):\n    z = x - 1\n    return z == 0\n",
    "pkg/nested.py": ("def outer(items):\n    def inner(v):\n        return v * 2 > 3\n"
                      "    async def later(v):\n        await v\n        return not v\n"
                      "    return [inner(i) for i in items if i is not None]\n"),
}


def reference_candidates(tree: Path, seed: int = 0, per_function: int = 2) -> list[bugs.Candidate]:
    """What candidates() must return: the same search, checking each change by parsing its whole file again."""
    rng = random.Random(seed)
    found = []
    for relative in bugs.source_files(tree):
        original = (tree / relative).read_text(encoding="utf-8", errors="replace")
        try:
            module = ast.parse(original)
        except SyntaxError:
            continue
        for function in ast.walk(module):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for name, modifier in bugs.MODIFIERS.items():
                    changes = list(modifier(function))
                    rng.shuffle(changes)
                    for node, replacement in changes[:per_function]:
                        buggy = _replace_whole(original, node, replacement)
                        if buggy is not None and buggy != original:
                            found.append(bugs.Candidate(relative, function.name, name, buggy, original))
    rng.shuffle(found)
    return found


def _replace_whole(text: str, node: ast.AST, replacement: str) -> str | None:
    data = text.encode("utf-8")
    offsets = [0]  # where lines start, as Python's tokenizer ends lines: \r\n, \r or \n (not a form feed)
    for i, byte in enumerate(data):
        if byte == 10 or byte == 13 and data[i + 1:i + 2] != b"\n":
            offsets.append(i + 1)
    start = offsets[node.lineno - 1] + node.col_offset
    end = offsets[node.end_lineno - 1] + node.end_col_offset
    segment = data[start:end].decode("utf-8", errors="replace")
    if "\n" in replacement or ("\n" in segment and isinstance(node, ast.expr)):
        replacement = f"({replacement})"
    changed = (data[:start] + replacement.encode("utf-8") + data[end:]).decode("utf-8", errors="replace")
    try:
        ast.parse(changed)
    except SyntaxError:
        return None
    return changed


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A package of crafted files and a few real ones (standard library modules, copied)."""
    root = tmp_path_factory.mktemp("tree")
    for name, text in CRAFTED.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode("utf-8"))
    for name in ("textwrap.py", "colorsys.py", "bisect.py"):
        shutil.copy(STDLIB / name, root / "pkg" / name)
    return root


@pytest.mark.parametrize("seed", [0, 7])
def test_candidates_are_those_of_parsing_each_whole_file(tree, seed):
    fast = bugs.candidates(tree, seed=seed)
    slow = reference_candidates(tree, seed=seed)
    assert len(fast) > 200  # real files give many
    assert [(c.path, c.function, c.modifier, c.buggy) for c in fast] == \
        [(c.path, c.function, c.modifier, c.buggy) for c in slow]
    assert {c.path for c in fast} >= set(CRAFTED)  # every crafted layout proposed changes
    assert {c.function for c in fast} >= {"area", "grow", "cached", "multi", "f", "g", "h", "k", "inner", "later"}


def test_each_candidate_changes_its_own_function_only(tree):
    """Positions as the tokenizer counts lines: a form feed or a lone \\r does not shift a change elsewhere."""
    (tree / "pkg" / "cr.py").write_bytes(b"def m(x):\r    return x > 1\r\rdef n(y):\r    return y + 2 == 3\r")
    try:
        found = [c for c in bugs.candidates(tree) if c.path in ("pkg/formfeed.py", "pkg/cr.py", "pkg/shapes.py")]
    finally:
        (tree / "pkg" / "cr.py").unlink()
    assert {c.function for c in found} >= {"h", "k", "m", "n", "area", "cached"}
    for candidate in found:
        before, after = (_functions(text) for text in (candidate.original, candidate.buggy))
        changed = {name for (name, dump), (_, other) in zip(before, after, strict=True) if dump != other}
        assert changed == {candidate.function}, candidate


def _functions(text: str) -> list[tuple[str, str]]:
    return [(node.name, ast.dump(node)) for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_a_change_that_breaks_the_syntax_is_not_proposed():
    text = "def f(x):\n    return x\n"
    function = ast.parse(text).body[0]
    source = bugs._Source(text)
    assert source.replace(function.body[0].value, "x +", function) is None
    assert source.replace(function.body[0].value, "x + 1", function) == "def f(x):\n    return x + 1\n"


NOW = {
    "pkg/ops.py": (
        "class Stack:\n    def push(self, item):\n        \"\"\"Add item on top.\"\"\"\n"
        "        self.items.append(item)\n        return len(self.items)\n\n"
        "    def peek(self):\n        return self.items[-1]\n\n\n"
        "def describe(n):\n    \"\"\"Words for n.\"\"\"\n    text = '''many\nthings'''\n    return text if n > 1 else 'one'\n\n\n"
        "def added_later(x):\n    return x\n\n\n"
        "def one_liner(x): return x + 1\n"),
    "pkg/same.py": "def f(x):\n    \"\"\"New words.\"\"\"\n    return x * 2  # a comment\n",
    "pkg/new_file.py": "def g():\n    return 1\n",
}
EARLIER = {
    "pkg/ops.py": (
        "class Stack:\n    def push(self, item):\n        \"\"\"Add item.\"\"\"\n"
        "        self.items.append(item)\n\n"
        "    def peek(self):\n        return self.items[-1]\n\n\n"
        "if True:\n    def describe(n):\n        text = '''many\nthings'''\n        return text\n\n\n"
        "def one_liner(x): return x\n"),
    "pkg/same.py": "def f(x):\n    \"\"\"Old words.\"\"\"\n    return x*2\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8", newline="")
    return root


def test_a_function_reverts_to_the_earlier_release_body(tmp_path):
    """Only functions whose statements changed (docstrings, comments and spacing aside) revert, each alone, matched
    by qualified name (describe sat under an `if` earlier: its lines are re-indented, its string's left alone)."""
    now, then = write_tree(tmp_path / "now", NOW), write_tree(tmp_path / "then", EARLIER)
    found = bugs.reverted(now, then)
    assert [(c.path, c.function, c.modifier) for c in found] == [("pkg/ops.py", "push", bugs.EARLIER_RELEASE),
                                                                ("pkg/ops.py", "describe", bugs.EARLIER_RELEASE)]
    push, describe = found
    assert push.buggy == NOW["pkg/ops.py"].replace("        return len(self.items)\n", "")  # its docstring stays
    assert describe.buggy == NOW["pkg/ops.py"].replace("    return text if n > 1 else 'one'\n", "    return text\n")
    for candidate in found:
        assert candidate.original == NOW["pkg/ops.py"] and candidate.bug_patch().startswith("diff --git a/pkg/ops.py")
        edit = candidate.fix_edit()
        assert candidate.buggy.count(edit["old"]) == 1
        assert candidate.buggy.replace(edit["old"], edit["new"]) == candidate.original
    assert bugs.reverted(now, now) == []


def test_a_reverted_body_takes_the_current_indentation(tmp_path):
    now = write_tree(tmp_path / "now", {"pkg/tabs.py": "def g(x):\n    y = x + 1\n    return y < 4\n"})
    then = write_tree(tmp_path / "then", {"pkg/tabs.py": "def g(x):\n\ty = x + 2\n\treturn y < 4\n"})
    [candidate] = bugs.reverted(now, then)
    assert candidate.buggy == "def g(x):\n    y = x + 2\n    return y < 4\n"
