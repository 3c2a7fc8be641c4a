"""SWE-smith's Python procedural modifiers over a package's files, run as a script with SWE-smith's own folder first
on sys.path (omrl/envs/swe/swesmith.py starts it; it never imports omrl, and omrl never imports it).

    python -I swesmith_worker.py TOOL_FOLDER < {"root": DIR, "files": [RELATIVE, ...], "seed": N}
    python -I swesmith_worker.py TOOL_FOLDER --check

Writes one JSON line per change: path, function (the entity's name: a function or a class), modifier (SWE-smith's
name), start and end (the entity's lines, 1-based, inclusive), indent (spaces before each rewritten line) and
rewrite (the entity's new text). Each modifier is made afresh per entity with the given seed, so the changes do
not depend on the order files are read in. A file or a change that fails is counted on stderr and skipped.
"""

import json
import sys

sys.path.insert(0, sys.argv[1])

from swesmith.bug_gen.adapters.python import get_entities_from_file_py  # noqa: E402
from swesmith.bug_gen.procedural.python import MODIFIERS_PYTHON  # noqa: E402


def main() -> None:
    if sys.argv[2:] == ["--check"]:
        print(json.dumps({"modifiers": [m.name for m in MODIFIERS_PYTHON]}))
        return
    request = json.load(sys.stdin)
    failed = 0
    for relative in request["files"]:
        entities = []
        try:
            get_entities_from_file_py(entities, f"{request['root']}/{relative}")
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            failed += 1
            continue
        for entity in entities:
            for template in MODIFIERS_PYTHON:
                if not template.can_change(entity):
                    continue
                modifier = type(template)(likelihood=template.likelihood, seed=request["seed"])
                try:
                    bug = modifier.modify(entity)
                except Exception:  # noqa: BLE001 - one modifier failing on one entity skips that change only
                    failed += 1
                    continue
                if bug is not None:
                    print(json.dumps({"path": relative, "function": entity.name, "modifier": modifier.name,
                                      "start": entity.line_start, "end": entity.line_end,
                                      "indent": entity.indent_level * entity.indent_size, "rewrite": bug.rewrite}))
    print(f"failed: {failed}", file=sys.stderr)


if __name__ == "__main__":
    main()
