"""Where `omrl study run` keeps a study's files: one place for the runner that writes them and for the status,
the report and the viewer that read them (the report layer sits below omrl.study, so the names live here).

    OUT/study.json                                  the figures (omrl.study.figures), once a test set is scored
    OUT/conditions/NAME-DIGEST/                     a condition (its recipe and task sets hashed into DIGEST)
    OUT/conditions/NAME-DIGEST/benchmark_state.json its finished runs (omrl.study.compare.Comparison)
    OUT/conditions/NAME-DIGEST/claims/KEY.pid       its runs in progress, each file holding its process' pid
    OUT/conditions/NAME-DIGEST/seed-N/              one seed's iterate run (its recipe's output_dir)
    OUT/conditions/NAME-DIGEST/seed-N/store         that seed's store
"""

from __future__ import annotations

import re
from pathlib import Path

STUDY_FILE = "study.json"
CONDITIONS = "conditions"
STATE_FILE = "benchmark_state.json"  # a condition folder's finished runs (IterateState)
STATE_LOCK = "benchmark_state.lock"  # held while a process adds to STATE_FILE
STORE = "store"
_SEED = re.compile(r"^seed-(\d+)$")


def condition_folder(out: Path, name: str, digest: str) -> Path:
    """OUT/conditions/NAME-DIGEST."""
    return out / CONDITIONS / f"{name}-{digest}"


def condition_folders(out: Path, name: str | None = None) -> list[Path]:
    """The condition folders under OUT/conditions (of condition `name` only, when given), sorted by name."""
    found = sorted(p for p in (out / CONDITIONS).glob("*") if p.is_dir())
    return [p for p in found if name is None or condition_name(p) == name]


def condition_name(folder: Path) -> str:
    """NAME of a condition folder NAME-DIGEST."""
    return folder.name.rpartition("-")[0]


def seed_folder(condition: Path, seed: int | str) -> Path:
    """CONDITION/seed-N: the seed's iterate run."""
    return condition / f"seed-{seed}"


def seed_store(condition: Path, seed: int | str) -> Path:
    """CONDITION/seed-N/store."""
    return seed_folder(condition, seed) / STORE


CLAIMS = "claims"  # a comparison folder's runs in progress: CLAIMS/KEY.pid holds the working process' pid


def claim_file(folder: Path, key: str) -> Path:
    """The claim file of run `key` in comparison folder `folder` (claim_key reads the key back)."""
    return folder / CLAIMS / (key.replace("/", "__") + ".pid")


def claim_key(claim: Path) -> str:
    """The run key a claim file stands for (claim_file's inverse)."""
    return claim.name[: -len(".pid")].replace("__", "/")


def claim_holder(claim: Path) -> int:
    """The pid in a claim file; 0 when it is gone, unreadable, or made but its pid not written yet."""
    try:
        return int(claim.read_text() or 0)
    except (OSError, ValueError):
        return 0


def store_seed(store_path: str | Path | None) -> int | None:
    """The seed of a store in a seed folder (.../seed-N/store: a study's or a comparison's); None for any other."""
    if store_path is None:
        return None
    match = _SEED.match(Path(store_path).resolve().parent.name)
    return int(match.group(1)) if match else None


def condition_of_store(store_path: str | Path | None) -> Path | None:
    """The condition folder of a study's seed store (OUT/conditions/NAME-DIGEST/seed-N/store); None for any other."""
    if store_seed(store_path) is None:
        return None
    condition = Path(str(store_path)).resolve().parent.parent
    return condition if condition.parent.name == CONDITIONS else None


def study_out(condition: Path) -> Path:
    """OUT of a condition folder OUT/conditions/NAME-DIGEST."""
    return condition.parent.parent
