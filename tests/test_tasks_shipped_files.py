"""The shipped grid task files are exactly what omrl.tasks.shipped_files regenerates from the generators."""

from __future__ import annotations

from pathlib import Path

from omrl.tasks.shipped_files import write_shipped_grid_tasks, write_shipped_grid_wall_tasks

SHIPPED = Path(__file__).resolve().parents[1] / "datasets" / "tasks"


def test_regenerating_the_shipped_grid_files_gives_the_same_bytes(tmp_path):
    written = write_shipped_grid_tasks(str(tmp_path)) + write_shipped_grid_wall_tasks(str(tmp_path))
    assert [Path(p).name for p in written] == ["grid_train.jsonl", "grid_eval.jsonl", "grid_walls_train.jsonl",
                                               "grid_walls_eval.jsonl"]
    for path in map(Path, written):
        assert path.read_bytes() == (SHIPPED / path.name).read_bytes(), path.name
