"""Losses that cannot hide: the store lists its parts, so a deleted, cut or flipped file is found by name.

Each test reproduces a finding of the second trust probe (issue 21, "Store") that the code before the
parts listing failed: a deleted part was invisible to check and queries, repair made the loss permanent
without a word, damaged side files went unreported, a flipped bit failed queries without a file name, a
part without ids gave a NULL row, and a broken manifest or card passed check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import cli
from omrl.schema.arrow import to_table
from omrl.store import Store, StoreError
from omrl.store.layout import CompactPolicy, side_path
from omrl.store.manifest import listing
from omrl.store.query import QueryError, run_query

FIXTURE_V1 = Path(__file__).parent / "fixtures" / "store_v1"
TOOL_CALLS = "SELECT * FROM tool_calls ORDER BY trajectory_id, message_position, call_index"


def rows(n: int, start: int = 0) -> list[dict]:
    return [make_trajectory(i).to_row() for i in range(start, start + n)]


@pytest.fixture
def three_parts(tmp_path) -> Store:
    """A store of three trajectories parts (4 rows each, with side files) and one annotations part."""
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=0))
    for start in (0, 4, 8):
        store.append(rows(4, start))
    store.append([{"trajectory_id": f"traj-{i}", "annotator": "len", "score": 1.0} for i in range(12)],
                 table="annotations")
    return store


def check_cli(store: Store, *flags: str):
    return CliRunner().invoke(cli, ["store", "check", str(store.path), *flags])


def flip_bit(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- the listing


def test_the_manifest_lists_each_part_with_its_rows_size_hash_and_side_files(three_parts):
    listed = listing(three_parts.manifest)
    assert [r.name for r in listed["trajectories"]] == [p.name for p in three_parts.parts()]
    for record, part in zip(listed["trajectories"], three_parts.parts(), strict=True):
        assert record.rows == 4 and record.file.bytes == part.stat().st_size and len(record.file.sha256) == 64
        assert record.sides["tool_calls"].bytes == side_path(part).stat().st_size
    assert [r.rows for r in listed["annotations"]] == [12]


def test_a_part_written_but_never_listed_is_not_committed_and_the_next_writer_removes_it(three_parts):
    before = three_parts.count()
    with three_parts._lock("write"):  # a writer killed after its part's rename, before the manifest
        record = three_parts._write_part(to_table(rows(2, start=90)), "trajectories")
    uncommitted = three_parts.table_dir("trajectories") / record.name
    assert uncommitted.exists() and three_parts.count() == before  # invisible: the listing is the commit
    assert check_cli(three_parts).exit_code == 0  # a killed writer's leftover is no problem
    three_parts.append(rows(1, start=50))
    assert not uncommitted.exists() and not side_path(uncommitted).exists()


# ---------------------------------------------------------------- a deleted part


def test_a_deleted_part_is_named_by_check_and_fails_reads_and_queries(three_parts):
    lost = three_parts.parts()[1]
    lost.unlink()
    result = check_cli(three_parts)
    assert result.exit_code == 1 and lost.name in result.output and "missing" in result.output
    for read in (three_parts.read, three_parts.count, three_parts.ids, lambda: three_parts.sql(
            "SELECT count(*) FROM trajectories")):
        with pytest.raises(StoreError, match=lost.name):
            read()
    query = CliRunner().invoke(cli, ["query", str(three_parts.path), "SELECT count(*) AS n FROM messages"])
    assert query.exit_code == 1 and lost.name in query.output and "missing" in query.output
    with pytest.raises(StoreError, match="nothing appended"):  # its ids are unknown: no append may double them
        three_parts.append(rows(1, start=100))


def test_repair_keeps_a_lost_part_listed_unless_told_to_accept_the_loss(three_parts):
    lost = three_parts.parts()[1]
    lost.unlink()
    result = check_cli(three_parts, "--repair")
    assert result.exit_code == 1, result.output
    assert f"kept listed, still lost: {lost}" in result.output and "4 rows, missing" in result.output
    assert lost.name in [r.name for r in listing(three_parts.manifest)["trajectories"]]
    assert side_path(lost).exists()  # nothing of the lost part is thrown away without being told to
    card = (three_parts.path / "README.md").read_text()
    assert lost.name in card  # load_dataset keeps failing on it too, instead of quietly reading fewer rows

    result = check_cli(three_parts, "--repair", "--accept-loss")
    assert result.exit_code == 0, result.output
    assert f"dropped (--accept-loss): {lost} (4 rows, missing)" in result.output
    assert three_parts.count() == 8 and lost.name not in (three_parts.path / "README.md").read_text()
    assert not side_path(lost).exists()
    assert CliRunner().invoke(cli, ["store", "check", str(three_parts.path), "--accept-loss"]).exit_code == 2


def test_a_deleted_annotations_part_is_named_too(three_parts):
    (lost,) = three_parts.parts("annotations")
    lost.unlink()
    result = check_cli(three_parts)
    assert result.exit_code == 1 and lost.name in result.output
    with pytest.raises(StoreError, match=lost.name):
        three_parts.sql("SELECT count(*) FROM scores")


# ---------------------------------------------------------------- damaged parts


def test_a_bit_flipped_part_is_named_by_check_and_by_the_failing_query(three_parts):
    part = three_parts.parts()[0]
    meta = pq.read_metadata(part).row_group(0)
    content = next(meta.column(i) for i in range(meta.num_columns)
                   if meta.column(i).path_in_schema == "messages.list.element.content")
    start = content.dictionary_page_offset or content.data_page_offset
    flip_bit(part, (start + content.total_compressed_size / 2) / part.stat().st_size)  # inside message text
    result = check_cli(three_parts)
    assert result.exit_code == 1 and part.name in result.output and "bytes differ" in result.output
    query = CliRunner().invoke(cli, ["query", str(three_parts.path), "SELECT sum(length(content)) AS n FROM messages"])
    assert query.exit_code == 1, query.output
    assert part.name in query.output and "damaged" in query.output


def test_a_part_cut_short_fails_reads_naming_it(three_parts):
    part = three_parts.parts()[2]
    part.write_bytes(part.read_bytes()[:-100])
    with pytest.raises(StoreError, match=f"{part.name}.*cut short"):
        three_parts.read()
    result = check_cli(three_parts, "--repair", "--accept-loss")
    assert result.exit_code == 0 and "damaged" in result.output
    assert (part.parent / ".quarantine" / part.name).is_file()  # its bytes are kept aside for the user
    assert three_parts.count() == 8


def test_a_part_without_an_id_column_is_flagged_and_gives_no_rows(three_parts):
    stray = three_parts.table_dir("trajectories") / "part-20990101T000000000000-1-noid0000.parquet"
    pq.write_table(three_parts.read().drop_columns(["id"]), stray)
    assert three_parts.sql("SELECT count(*) AS n, count(id) AS ids FROM trajectories").to_pylist() == [
        {"n": 12, "ids": 12}]  # no NULL-id rows
    problems = three_parts.check()
    assert [p.path for p in problems] == [stray] and "no id column" in problems[0].error
    report = three_parts.repair()
    assert report.quarantined == [str(stray)] and report.adopted == []  # never added: it is not a part
    assert three_parts.check() == [] and three_parts.count() == 12


def test_a_part_without_an_id_column_gives_no_rows_in_a_store_without_a_listing(tmp_path):
    shutil.copytree(FIXTURE_V1, tmp_path / "v1")
    store = Store(tmp_path / "v1")
    n = store.count()
    stray = store.table_dir("trajectories") / "part-20990101T000000000000-1-noid0000.parquet"
    pq.write_table(store.read().drop_columns(["id"]), stray)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert store.sql("SELECT count(*) AS n, count(id) AS ids FROM trajectories").to_pylist() == [{"n": n, "ids": n}]
    assert [p.path for p in store.check()] == [stray]


# ---------------------------------------------------------------- side files


@pytest.mark.parametrize("damage", ["deleted", "cut", "flipped", "another part's"])
def test_a_damaged_side_file_is_named_by_check_and_rebuilt_by_repair(three_parts, damage):
    expected = three_parts.sql(TOOL_CALLS)
    first, second, _ = three_parts.parts()
    side = side_path(first)
    if damage == "deleted":
        side.unlink()
    elif damage == "cut":
        side.write_bytes(side.read_bytes()[:-50])
    elif damage == "flipped":
        flip_bit(side, 0.2)
    else:
        shutil.copy(side_path(second), side)
    result = check_cli(three_parts)
    assert result.exit_code == 1 and side.name in result.output and "side file" in result.output
    result = check_cli(three_parts, "--repair")
    assert result.exit_code == 0 and f"side file rebuilt: {side}" in result.output, result.output
    fresh = Store(three_parts.path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt side file is used, not skipped
        assert fresh.side_files() == ([side_path(p) for p in fresh.parts()], [])
        assert fresh.sql(TOOL_CALLS).equals(expected)


# ---------------------------------------------------------------- the manifest and the card


@pytest.mark.parametrize(("damage", "message"), [
    (lambda text: text[:25], "not valid JSON"),
    (lambda text: json.dumps({**json.loads(text), "schema_version": 99}), "schema version 99, newer than"),
    (lambda text: json.dumps({**json.loads(text), "schema_version": "two"}), "schema_version must be"),
    (lambda text: json.dumps([1, 2]), "not a JSON object"),
    (lambda text: text.replace('"name": "part-', '"name": "../../part-', 1), "not a part file name"),
])
def test_a_broken_or_too_new_manifest_fails_check_with_a_clear_message(three_parts, damage, message):
    manifest = three_parts.path / "omrl.json"
    manifest.write_text(damage(manifest.read_text()))
    result = check_cli(three_parts)
    assert result.exit_code == 1 and "omrl.json" in result.output and message in result.output, result.output
    assert "Traceback" not in result.output
    with pytest.raises(StoreError, match=message):
        Store(three_parts.path)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda card: None, "README.md: missing"),
    (lambda card: card.replace("configs:", "configs: [", 1), "README.md: broken"),
    (lambda card: card.replace("- data/trajectories/part-", "- data/trajectories/gone-part-", 1), "other trajectories"),
])
def test_a_broken_card_fails_check_and_repair_rewrites_it(three_parts, damage, message):
    import datasets

    card = three_parts.path / "README.md"
    changed = damage(card.read_text())
    if changed is None:
        card.unlink()
    else:
        card.write_text(changed)
    result = check_cli(three_parts)
    assert result.exit_code == 1 and message in result.output, result.output
    assert check_cli(three_parts, "--repair").exit_code == 0
    loaded = datasets.load_dataset(str(three_parts.path), "trajectories", split="train")
    assert sorted(loaded["id"]) == sorted(three_parts.ids())


# ---------------------------------------------------------------- stores from before the listing


def test_a_store_from_before_the_listing_opens_and_its_first_commit_writes_the_listing(tmp_path):
    shutil.copytree(FIXTURE_V1, tmp_path / "v1")
    store = Store(tmp_path / "v1")
    assert not store.listed and store.check() == []
    old, n = [p.name for p in store.parts()], store.count()
    note = check_cli(store)
    assert note.exit_code == 0 and "does not list the parts" in note.output
    store.append(rows(2, start=500))
    assert store.listed
    assert [r.name for r in listing(store.manifest)["trajectories"]][:len(old)] == old  # every old part listed
    assert store.check() == [] and store.count() == n + 2
    (store.table_dir("trajectories") / old[0]).unlink()
    assert old[0] in check_cli(store).output  # now a deleted old part is found too


def test_repair_upgrades_a_store_from_before_the_listing(tmp_path):
    shutil.copytree(FIXTURE_V1, tmp_path / "v1")
    store = Store(tmp_path / "v1")
    result = check_cli(store, "--repair")
    assert result.exit_code == 0 and "now lists every part" in result.output, result.output
    assert store.listed and store.check() == []
    assert store.side_files()[1] == []  # the old parts got their side files too


# ---------------------------------------------------------------- the manifest under concurrent writers


SETTER = textwrap.dedent(
    """
    import sys
    from omrl.store import Store
    from omrl.store.layout import CompactPolicy
    store = Store(sys.argv[1])
    for i in range(40):  # every change rewrites omrl.json, which also holds the parts listing
        store.set_compact_policy(CompactPolicy(small_parts=0, small_part_bytes=1000 + i))
    """
)


def test_manifest_changes_beside_appends_never_drop_a_committed_part(tmp_path):
    store = Store.create(tmp_path / "s")
    store.set_compact_policy(CompactPolicy(small_parts=0))
    setter = subprocess.Popen([sys.executable, "-c", SETTER, str(store.path)])
    for start in range(0, 60, 3):
        store.append(rows(3, start))
    assert setter.wait(timeout=120) == 0
    assert store.count() == 60 and store.check() == []


def test_a_query_on_an_older_connection_names_a_part_deleted_since(three_parts):
    con = three_parts.connect()  # as the viewer holds one
    lost = three_parts.parts()[0]
    lost.unlink()
    with pytest.raises(QueryError, match=lost.name):
        run_query(three_parts, "SELECT sum(length(content)) FROM messages", con=con)
