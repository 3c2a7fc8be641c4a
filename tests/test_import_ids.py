"""Import ids come from the data, not the file name; run ids from the path relative to the import root."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from omrl.formats.importer import import_files, load_trajectories
from omrl.store import Store


def _conv(question: str) -> dict:
    return {"conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": "done"}]}


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_same_content_under_two_names_is_one_row(tmp_path):
    a = _write(tmp_path / "run_a" / "X.json", [_conv("fix bug 1")])
    b = tmp_path / "copy_of_X.json"
    shutil.copy(a, b)
    store = tmp_path / "s"
    [first] = import_files([a], store)
    assert first.imported == 1
    [second] = import_files([b], store)
    assert second.imported == 0 and second.already_present == 1
    assert Store(store).count() == 1


def test_two_contents_under_one_name_are_two_rows(tmp_path):
    a = _write(tmp_path / "run_a" / "X.traj", {"history": [{"role": "user", "content": "fix"},
                                                           {"role": "assistant", "content": "try 1"}],
                                               "trajectory": [], "info": {}})
    b = _write(tmp_path / "run_b" / "X.traj", {"history": [{"role": "user", "content": "fix"},
                                                           {"role": "assistant", "content": "try 2"}],
                                               "trajectory": [], "info": {}})
    store = tmp_path / "s"
    reports = import_files([a, b], store)
    assert [r.imported for r in reports] == [1, 1]
    rows = Store(store).read().to_pylist()
    assert len({r["id"] for r in rows}) == 2
    assert sorted(r["run_id"] for r in rows) == ["import:run_a/X", "import:run_b/X"]
    assert {r["task_id"] for r in rows} == {"X"}  # the same instance, two attempts


def test_identical_records_in_one_file_stay_distinct_and_reimport_adds_nothing(tmp_path):
    path = _write(tmp_path / "g.json", [_conv("q"), _conv("q"), _conv("other")])
    rows = load_trajectories(path)
    assert len({r["id"] for r in rows}) == 3
    store = tmp_path / "s"
    import_files([path], store)
    # the same records, reordered and with one new record, under another name: only the new one goes in
    again = _write(tmp_path / "renamed.json", [_conv("other"), _conv("q"), _conv("new"), _conv("q")])
    [report] = import_files([again], store)
    assert (report.imported, report.already_present) == (1, 3)
    assert Store(store).count() == 4


def test_run_ids_are_relative_to_the_import_root(tmp_path):
    weather = _write(tmp_path / "weather" / "val.json", [_conv("rain?")])
    movie = _write(tmp_path / "movie" / "val.json", [_conv("film?")])
    store = tmp_path / "s"
    import_files([weather, movie], store)
    runs = sorted(r["run_id"] for r in Store(store).read().to_pylist())
    assert runs == ["import:movie/val", "import:weather/val"]
    meta = json.loads(Store(store).read().to_pylist()[0]["metadata"])
    assert meta["import"]["file"].endswith("/val.json")


def test_run_ids_relative_to_the_working_directory_across_commands(tmp_path, monkeypatch):
    weather = _write(tmp_path / "weather" / "val.json", [_conv("rain?")])
    movie = _write(tmp_path / "movie" / "val.json", [_conv("film?")])
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "s"
    import_files([os.path.relpath(weather)], store)
    import_files([movie], store)  # a second command, absolute path: still relative to the working directory
    assert sorted(r["run_id"] for r in Store(store).read().to_pylist()) == ["import:movie/val", "import:weather/val"]


def test_records_a_store_holds_under_their_pre_content_id_are_not_imported_again(tmp_path):
    """A store filled before ids came from content: the same file again adds nothing."""
    from omrl.formats.values import short_hash

    path = _write(tmp_path / "old.json", [{"id": "t1", **_conv("q1")}, _conv("q2")])
    rows = load_trajectories(path)
    for row, native in zip(rows, ["t1", None], strict=True):  # the ids the previous scheme gave them
        row["id"] = short_hash("import", "sharegpt", "old.json", rows.index(row), native, n=24)
    store = Store.create(tmp_path / "s")
    store.append(rows)
    [report] = import_files([path], store)
    assert (report.imported, report.already_present) == (0, 2) and store.count() == 2
