"""Damage cases: break one file of a store the way disks, tools and people do, and see whether check names it.

Each case copies a small store (three trajectories parts with their side files, an annotations part) and
damages one file: a part deleted, cut short, a bit flipped at a random place, replaced by one without an
id column; a side file deleted, cut short or flipped; omrl.json not JSON or from a newer omrl; the card
deleted or its YAML broken. Then it runs `omrl store check` as a user would. A case is a hidden loss when
check exits 0 or its output does not name the damaged file.

Used by tests/test_chaos.py (a few flips) and benchmarks/chaos.py (`hidden_losses`, target 0).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from omrl.store import Store
from omrl.store.layout import CompactPolicy, side_path
from omrl.testing.synthetic import synthetic_trajectories
from tests.cases.chaos import _env as command_env

CHECK_TIMEOUT_S = 120


@dataclass
class DamageReport:
    cases: int = 0
    hidden_losses: int = 0  # damaged files check did not report (exit 0, or the file not named)
    details: list[str] = field(default_factory=list)  # one line per hidden loss

    def to_dict(self) -> dict:
        return {"cases": self.cases, "hidden_losses": self.hidden_losses, "details": self.details}


def make_store(path: Path) -> Store:
    """The store every case starts from: 3 trajectories parts (with side files), 1 annotations part."""
    store = Store.create(path)
    store.set_compact_policy(CompactPolicy(small_parts=0))
    rows = list(synthetic_trajectories(90, seed=5))
    for start in range(0, 90, 30):
        store.append(rows[start:start + 30])
    store.append([{"trajectory_id": r["id"], "annotator": "len", "score": float(len(r["messages"]))} for r in rows],
                 table="annotations")
    return store


def _parts(store: Path, table: str = "trajectories") -> list[Path]:
    return sorted((store / "data" / table).glob("part-*.parquet"))


def _delete(path: Path, rng: random.Random) -> Path:
    path.unlink()
    return path


def _cut(path: Path, rng: random.Random) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * rng.uniform(0.1, 0.95))])
    return path


def _flip(path: Path, rng: random.Random) -> Path:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return path


def _without_id(path: Path, rng: random.Random) -> Path:
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["id"]), path)
    return path


def _part(damage: Callable[[Path, random.Random], Path], table: str = "trajectories"):
    return lambda store, rng: damage(rng.choice(_parts(store, table)), rng)


def _side(damage: Callable[[Path, random.Random], Path]):
    return lambda store, rng: damage(side_path(rng.choice(_parts(store))), rng)


def _manifest_not_json(store: Path, rng: random.Random) -> Path:
    path = store / "omrl.json"
    path.write_text(path.read_text()[: rng.randrange(1, 40)])
    return path


def _manifest_from_the_future(store: Path, rng: random.Random) -> Path:
    path = store / "omrl.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": 99}))
    return path


def _card_deleted(store: Path, rng: random.Random) -> Path:
    return _delete(store / "README.md", rng)


def _card_broken(store: Path, rng: random.Random) -> Path:
    path = store / "README.md"
    path.write_text(path.read_text().replace("configs:", "configs: [", 1))
    return path


def cases(flips: int) -> list[tuple[str, Callable[[Path, random.Random], Path]]]:
    """(name, damage) of every case; `flips` random bit flips of a part and of a side file each."""
    out = [("part deleted", _part(_delete)), ("annotations part deleted", _part(_delete, "annotations")),
           ("part cut short", _part(_cut)), ("part without id column", _part(_without_id)),
           ("side file deleted", _side(_delete)), ("side file cut short", _side(_cut)),
           ("omrl.json not JSON", _manifest_not_json), ("omrl.json schema_version 99", _manifest_from_the_future),
           ("card deleted", _card_deleted), ("card YAML broken", _card_broken)]
    out += [(f"part bit flip {i + 1}", _part(_flip)) for i in range(flips)]
    out += [(f"side file bit flip {i + 1}", _side(_flip)) for i in range(max(1, flips // 2))]
    out += [(f"annotations part bit flip {i + 1}", _part(_flip, "annotations")) for i in range(max(1, flips // 3))]
    return out


def run_damage_cases(workdir: Path, flips: int = 6, seed: int = 0) -> DamageReport:
    """Run every case on a fresh copy of one store; count the damaged files check did not name."""
    rng = random.Random(seed)
    template = workdir / "template"
    make_store(template)
    report = DamageReport()
    for i, (name, damage) in enumerate(cases(flips)):
        store = workdir / f"case-{i}"
        shutil.copytree(template, store)
        damaged = damage(store, rng)
        check = subprocess.run([sys.executable, "-m", "omrl", "store", "check", str(store)], capture_output=True,
                               text=True, timeout=CHECK_TIMEOUT_S, env={**command_env(), "COLUMNS": "400"})
        output = check.stdout + check.stderr
        report.cases += 1
        if check.returncode == 0 or damaged.name not in output:
            report.hidden_losses += 1
            report.details.append(f"{name} ({damaged.relative_to(store)}): exit {check.returncode}, "
                                  f"{' '.join(output.split())[-300:]}")
        shutil.rmtree(store)
    return report
