"""The store's dataset card (README.md): the front matter that makes a store loadable with
`datasets.load_dataset`, listing each table's live parts by exact name."""

from __future__ import annotations

import re
from typing import Any

from omrl.schema import SCHEMA_VERSION
from omrl.store.manifest import TABLES

# A dataset card's YAML front matter (the configs `datasets.load_dataset` reads).
CARD_FRONT_MATTER = re.compile(r"^---\n(.*?)\n---\n", re.S)


def card_front_matter(card: str) -> dict[str, Any]:
    """The card's YAML front matter ({} when it has none); ValueError when it does not parse."""
    import yaml

    match = CARD_FRONT_MATTER.match(card)
    if match is None:
        return {}
    try:
        # libyaml's loader where it is built in: the card is read at every commit, pure-Python YAML cost
        # more than the part's write on small appends; the same safe constructors either way.
        front = yaml.load(match.group(1), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ValueError(f"its front matter is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(front, dict):
        raise ValueError("its front matter is not a YAML mapping")
    return front


def card_parts(card: str) -> dict[str, list[str] | None]:
    """The part names the card's `configs:` give `load_dataset` for each table (None: a glob, or no
    config for the table); ValueError when the card's front matter or configs are malformed."""
    configs = card_front_matter(card).get("configs") or []
    if not isinstance(configs, list):
        raise ValueError("its `configs:` is not a list")
    out: dict[str, list[str] | None] = {table: None for table in TABLES}
    for config in configs:
        table = config.get("config_name") if isinstance(config, dict) else None
        if table not in TABLES:
            continue
        files = config.get("data_files")
        paths = files[0].get("path") if isinstance(files, list) and files and isinstance(files[0], dict) else None
        if isinstance(paths, str):
            paths = None if "*" in paths else [paths]
        if paths is not None and not (isinstance(paths, list) and all(isinstance(x, str) for x in paths)):
            raise ValueError(f"the data_files of its {table} config are not a list of paths")
        prefix = f"data/{table}/"
        out[table] = None if paths is None else [x.removeprefix(prefix) for x in paths]
    return out


_CARD_TAGS = "tags:\n- omrl\n- agent-trajectories\n- reinforcement-learning"


def dataset_card(name: str, description: str = "") -> str:
    """The README.md that makes a store loadable with `datasets.load_dataset(path)` (no parts yet)."""
    return f"""---
{card_configs({table: [] for table in TABLES})}
{_CARD_TAGS}
---

# {name}

An [omrl](https://github.com/omrl/omrl) trajectory store (schema version {SCHEMA_VERSION}).
{description}

- `trajectories`: one row per attempt by one policy at one task, messages in OpenAI chat format.
- `annotations`: one row per (trajectory, annotator): metric scores and LLM-as-judge verdicts.

```python
from datasets import load_dataset
trajectories = load_dataset("path/or/hub-id", "trajectories", split="train")
```

Query it with SQL: `omrl query STORE "SELECT env, avg(reward) FROM trajectories GROUP BY env"`.
"""


def card_configs(parts: dict[str, list[str]]) -> str:
    """The card's `configs:` block listing each table's live parts by name.

    Exact names, not a glob: a glob would also match the parts a crashed compaction left behind, and
    `load_dataset` would then return their rows twice. A table without parts keeps the glob (it matches
    nothing, as before).
    """
    lines = ["configs:"]
    for table in TABLES:
        lines.append(f"- config_name: {table}")
        if table == "trajectories":
            lines.append("  default: true")
        lines += ["  data_files:", "  - split: train"]
        names = parts.get(table) or []
        if names:
            lines.append("    path:")
            lines += [f"    - data/{table}/{name}" for name in names]
        else:
            lines.append(f"    path: data/{table}/part-*.parquet")
    return "\n".join(lines)




def replace_card_configs(card: str, configs: str) -> str:
    """The card with its YAML `configs:` block replaced (the rest of the front matter and the text kept);
    front matter that is not valid YAML is replaced whole, the text below it kept."""
    match = CARD_FRONT_MATTER.match(card)
    if match is None:  # no front matter (a hand-edited card): give it one
        return f"---\n{configs}\n---\n\n{card}"
    front = match.group(1)
    try:
        card_front_matter(card)
    except ValueError:  # a broken front matter: a fresh one, as a new store's card has
        front = _CARD_TAGS
    kept = re.sub(r"^configs:\n(?:[ -].*\n?)*", "", front + "\n", flags=re.M).strip("\n")
    return f"---\n{configs}" + (f"\n{kept}" if kept else "") + "\n---\n" + card[match.end():]
