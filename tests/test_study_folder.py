"""The study folder's layout (omrl.store.study_folder): the paths the runner writes are the ones its readers parse."""

from omrl.store.study_folder import (
    condition_folder,
    condition_folders,
    condition_name,
    condition_of_store,
    seed_store,
    store_seed,
    study_out,
)


def test_a_seed_store_leads_back_to_its_condition_and_study(tmp_path):
    folder = condition_folder(tmp_path, "few-demos", "0123456789ab")
    store = seed_store(folder, 3)
    store.mkdir(parents=True)
    assert store_seed(store) == 3
    assert condition_of_store(store) == folder.resolve()
    assert condition_name(folder) == "few-demos"  # a name with a dash keeps it: only the digest is cut
    assert study_out(folder) == tmp_path
    condition_folder(tmp_path, "few", "ffffffffffff").mkdir()
    assert condition_folders(tmp_path, "few-demos") == [folder]  # not "few", whose folder name is a prefix
    assert len(condition_folders(tmp_path)) == 2


def test_a_store_outside_a_study_has_no_condition(tmp_path):
    comparison = tmp_path / "comparison" / "seed-1" / "store"  # a comparison's seed store: a seed, no condition
    other = tmp_path / "runs" / "store"
    for store in (comparison, other):
        store.mkdir(parents=True)
    assert store_seed(comparison) == 1 and condition_of_store(comparison) is None
    assert store_seed(other) is None and condition_of_store(other) is None
    assert store_seed(None) is None and condition_of_store(None) is None
