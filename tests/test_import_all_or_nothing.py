"""Multi-file imports are all or nothing by default; --partial writes the good files; a summary always."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl.cli.main import cli
from omrl.formats.importer import ImportFailed, import_files
from omrl.store import Store


def _good(i: int) -> dict:
    return {"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}


def _files(tmp_path: Path, bad_last: bool = True) -> list[Path]:
    paths = []
    for i in range(5):
        path = tmp_path / "in" / f"f{i}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        records = [_good(10 * i), _good(10 * i + 1)]
        if bad_last and i == 4:
            records.append({"messages": [{"role": "wizard", "content": "?"}]})
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    return paths


def _parts(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "data").rglob("*") if p.is_file()) if store.exists() else []


def test_fifth_bad_file_writes_nothing_and_leaves_no_store(tmp_path):
    store = tmp_path / "s"
    with pytest.raises(ImportFailed, match=r"f4\.jsonl record 2 messages\[0\]: unknown role 'wizard'") as info:
        import_files(_files(tmp_path), store)
    assert not store.exists()  # not even an empty store folder
    assert [r.status for r in info.value.reports] == ["not written"] * 4 + ["failed"]
    assert "1 of 5 files failed, so nothing was written" in str(info.value)


def test_bad_file_leaves_an_existing_store_unchanged(tmp_path):
    store = tmp_path / "s"
    import_files([_files(tmp_path, bad_last=False)[0]], store)
    before = (_parts(store), Store(store).count())
    with pytest.raises(ImportFailed):
        import_files(_files(tmp_path), store)
    assert (_parts(store), Store(store).count()) == before


def test_partial_writes_the_good_files_in_one_part(tmp_path):
    store = tmp_path / "s"
    with pytest.raises(ImportFailed, match="1 of 5 files failed and were not written") as info:
        import_files(_files(tmp_path), store, partial=True)
    assert [r.status for r in info.value.reports] == ["written"] * 4 + ["failed"]
    assert Store(store).count() == 8 and len(Store(store).parts()) == 1


def test_cli_prints_the_summary_on_failure_and_partial_lists_what_was_written(tmp_path):
    files = [str(p) for p in _files(tmp_path)]
    runner = CliRunner()
    result = runner.invoke(cli, ["import", *files, "--store", str(tmp_path / "s")])
    assert result.exit_code == 1
    assert "f4.jsonl record 2" in result.output and "not written" in result.output and "failed" in result.output
    assert not (tmp_path / "s").exists()
    result = runner.invoke(cli, ["import", *files, "--store", str(tmp_path / "s"), "--partial"])
    assert result.exit_code == 1
    assert "written: f0.jsonl, f1.jsonl, f2.jsonl, f3.jsonl" in result.output
    assert Store(tmp_path / "s").count() == 8


def test_skip_errors_with_every_record_skipped_exits_non_zero(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps({"traj": _good(i)["messages"], "reward": 1}) + "\n" for i in range(3)))
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(path), "--store", str(tmp_path / "s"), "--format", "openai",
                                 "--skip-errors"])
    assert result.exit_code == 1, result.output
    assert "every record (3) was skipped" in result.output
    assert "--messages-key traj" in result.output  # the skipped records' reason says what would fix it
    assert not (tmp_path / "s").exists()


def test_summary_table_on_success(tmp_path):
    files = [str(p) for p in _files(tmp_path, bad_last=False)]
    result = CliRunner().invoke(cli, ["import", *files, "--store", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert result.output.count("written") >= 5 and "already in" in result.output
    again = CliRunner().invoke(cli, ["import", *files, "--store", str(tmp_path / "s")])
    assert again.exit_code == 0 and "nothing new" in again.output
