"""Stores on S3-compatible object storage, against moto's real S3 server on 127.0.0.1 (omrl.store.s3).

The same rows give the same reads and queries as a local store; compaction keeps every row once, even
when it dies between its merged part and the deletes; ids stay unique under concurrent writers; a
writer SIGKILLed in the middle of a part upload leaves nothing visible, `store check` clean, and its
lock is taken over once its lease expires.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_trajectory

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from omrl.cli.main import cli  # noqa: E402
from omrl.errors import UsageError  # noqa: E402
from omrl.store import REPLACES_KEY, Store, StoreError  # noqa: E402
from omrl.store import s3 as s3_module  # noqa: E402
from omrl.store.query import QueryError  # noqa: E402
from omrl.store.s3 import S3Path, s3_storage  # noqa: E402
from omrl.store.search import search  # noqa: E402
from omrl.store.storage import StorageError  # noqa: E402

BUCKET = "omrl-test"
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def endpoint():
    """A real S3-compatible server (moto) on 127.0.0.1, with one bucket."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request in the test output
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server._server.server_address[:2]
    url = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, **{k.lower(): v for k, v in CREDENTIALS.items()
                                            if k != "AWS_DEFAULT_REGION"},
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture()
def s3_env(endpoint, monkeypatch):
    """The AWS_* variables a user would set for this server; returns them (for subprocesses)."""
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


@pytest.fixture()
def url(s3_env):
    """A fresh store URL (its own prefix) in the bucket."""
    return f"s3://{BUCKET}/stores/{uuid.uuid4().hex[:10]}"


def rows(n: int, start: int = 0) -> list[dict]:
    return [make_trajectory(i, task_id=f"task-{i % 3}").to_row() for i in range(start, start + n)]


def objects(prefix: str) -> list[str]:
    """Every object key under an s3:// prefix, relative to it."""
    fs = s3_storage().s3
    root = prefix.removeprefix("s3://")
    return sorted(key.removeprefix(root + "/") for key in fs.find(root))


def by_id(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


QUERIES = [
    "SELECT id, task_id, reward, success FROM trajectories ORDER BY id",
    "SELECT trajectory_id, position, role, content FROM messages ORDER BY trajectory_id, position",
    "SELECT * FROM tool_calls ORDER BY trajectory_id, message_position, call_index",
    "SELECT group_id, n, mean_reward FROM groups ORDER BY group_id",
]


# ------------------------------------------------------------------------------ read, query, compact


def test_append_read_and_query_equal_a_local_store(url, tmp_path):
    local = Store.create(tmp_path / "local")
    remote = Store.create(url)
    assert isinstance(remote.path, S3Path) and str(remote.path) == url
    for start in (0, 5):
        batch = rows(5, start)  # one batch for both: rows carry the time they were made
        local.append(batch)
        remote.append(batch)
    assert len(remote.parts()) == 2 and remote.count() == 10
    assert by_id(remote.read()) == by_id(local.read())
    assert remote.ids() == local.ids()
    for sql in QUERIES:
        assert remote.sql(sql).to_pylist() == local.sql(sql).to_pylist(), sql
    side_files, lacking = remote.side_files()
    assert len(side_files) == 2 and lacking == []  # tool_calls came from the side files, not an unnest
    assert remote.check() == []
    names = objects(url)
    assert "omrl.json" in names and "README.md" in names
    assert sum(n.startswith("data/trajectories/part-") for n in names) == 2
    card = remote.storage.read_bytes(remote.path / "README.md").decode()
    for part in remote.parts():
        assert f"data/trajectories/{part.name}" in card  # the card lists exactly the live parts


def test_queries_stay_confined_on_an_s3_store(url):
    store = Store.create(url)
    store.append(rows(3))
    part = store.parts()[0]
    for sql in (f"SELECT * FROM read_parquet('{part}')", f"SELECT * FROM '{part}'",
                "SELECT * FROM read_text('/etc/hostname')"):
        with pytest.raises(QueryError):
            store.sql(sql)


def test_compaction_keeps_every_row_once_and_readers_never_see_a_change(url):
    store = Store.create(url)
    expected = set()
    seen_counts: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    for round_ in range(2):
        for i in range(3):
            batch = rows(4, start=round_ * 100 + i * 10)
            store.append(batch)
            expected |= {r["id"] for r in batch}
        stop = threading.Event()

        def read_while_compacting(n=len(expected), stop=stop):
            reader = Store(url)  # another client of the same store, with its own caches
            try:
                while not stop.is_set():
                    seen_counts.append((n, reader.count()))
                    seen_counts.append((n, reader.sql("SELECT count(*) AS n FROM trajectories").column("n")[0].as_py()))
            except BaseException as exc:  # handed to the test thread below
                errors.append(exc)

        thread = threading.Thread(target=read_while_compacting)
        thread.start()
        new = store.compact()
        time.sleep(0.2)  # a few reads after the compaction too
        stop.set()
        thread.join()
        assert new is not None and store.parts() == [new]
        assert store.ids() == expected and store.count() == len(expected)
    assert errors == []
    assert seen_counts and all(n == got for n, got in seen_counts)
    assert sum(n.startswith("data/trajectories/part-") for n in objects(url)) == 1  # replaced parts deleted
    assert store.check() == []


def test_a_compaction_killed_before_its_deletes_hides_the_replaced_parts(url, monkeypatch):
    store = Store.create(url)
    for start in (0, 10, 20):
        store.append(rows(4, start))
    old = store.parts()

    def crash(self, part):
        raise OSError("killed before the delete")

    with monkeypatch.context() as patch, pytest.raises(OSError, match="killed"):
        patch.setattr(Store, "_remove_part", crash)
        store.compact()
    reader = Store(url)
    listed = reader._all_parts("trajectories")
    assert len(listed) == 4  # the merged part and the three it replaces are all there
    merged = next(p for p in listed if p not in old)
    meta = reader.storage.s3.open(reader.storage.arrow_path(merged), "rb")
    import pyarrow.parquet as pq

    assert set(json.loads(pq.read_metadata(meta).metadata[REPLACES_KEY])) == {p.name for p in old}
    assert reader.parts() == [merged] and reader.count() == 12  # no row twice
    assert reader.sql("SELECT count(*) AS n, count(DISTINCT id) AS d FROM trajectories").to_pylist() == [
        {"n": 12, "d": 12}]
    reader.append(rows(2, start=50))  # the next writer finishes the cleanup
    assert sum(n.startswith("data/trajectories/part-") for n in objects(url)) == 2
    assert reader.count() == 14 and reader.check() == []


# ----------------------------------------------------------------------------------- unique ids, locks


def test_ids_stay_unique_across_appends_and_concurrent_writers(url):
    store = Store.create(url)
    store.append(rows(5))
    with pytest.raises(StoreError, match="already holds"):
        store.append(rows(2, start=4))  # traj-4 is there already: nothing written
    assert store.count() == 5 and len(store.parts()) == 1
    assert store.append(rows(2, start=4), skip_existing=True).written == 1

    # Two writers (separate clients) racing with overlapping batches: every id is stored once.
    results = []

    def write(start):
        results.append(Store(url).append(rows(20, start=start), skip_existing=True))

    threads = [threading.Thread(target=write, args=(s,)) for s in (10, 20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = store.read(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 6 + 30
    assert sorted(r.written for r in results) == [10, 20] and sum(r.skipped for r in results) == 10
    assert store.check() == []


def test_a_held_lock_is_refused_without_wait_and_an_expired_one_is_taken_over(url, monkeypatch):
    store = Store.create(url)
    lock_key = f"{store.path.key}/.write.lock"
    fs = store.storage.s3
    with store._lock("write") as held:
        assert held and fs.exists(lock_key)
        with Store(url)._lock("write", wait=False) as other:
            assert other is False
    assert not fs.exists(lock_key)  # released
    # A writer killed while holding the lock leaves its lease; once expired, the next writer takes it.
    fs.pipe_file(lock_key, json.dumps({"owner": "gone:1:x", "expires": time.time() - 1}).encode())
    started = time.monotonic()
    store.append(rows(2))
    assert time.monotonic() - started < 10 and store.count() == 2


def test_a_writer_that_lost_its_lease_writes_nothing(url, monkeypatch):
    monkeypatch.setattr(s3_module, "LEASE_SECONDS", 0.6)
    store = Store.create(url)
    lock_key = f"{store.path.key}/.write.lock"
    with pytest.raises(StorageError, match="lost the store lock"), store._lock("write"):
        # Another writer took the lock over (as if this one had stalled past its lease).
        store.storage.s3.pipe_file(lock_key, b'{"owner": "someone-else", "expires": 1e12}')
        time.sleep(0.5)  # the renewal (every LEASE/3) finds the lease is no longer ours
        store._write_part(__import__("omrl.schema.arrow", fromlist=["to_table"]).to_table(rows(1), "trajectories"),
                          "trajectories")
    assert store.storage.s3.exists(lock_key)  # the other writer's lease is not deleted
    assert store._all_parts("trajectories") == []


# -------------------------------------------------------------------------------- crash mid-append

CRASHING_APPEND = textwrap.dedent("""
    import http.client, sys, time
    from urllib.parse import urlparse
    sys.path.insert(0, {tests!r})
    import omrl.store.s3 as s3
    from conftest import make_trajectory
    from omrl.store import Store

    s3.LEASE_SECONDS = 1.0  # so the test's next writer takes the lock over soon
    real_put = s3.S3Storage._put

    def put(self, key, data, **condition):
        if "/data/trajectories/part-" not in key:
            return real_put(self, key, data, **condition)
        # The part's upload: send the request line, headers and half of the body, then hang there.
        url = urlparse({endpoint!r})
        conn = http.client.HTTPConnection(url.hostname, url.port)
        bucket, _, name = key.partition("/")
        conn.putrequest("PUT", "/" + bucket + "/" + name)
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders()
        conn.send(data[: len(data) // 2])
        open({marker!r}, "w").write(key)
        time.sleep(600)

    s3.S3Storage._put = put
    Store({url!r}).append([make_trajectory(i).to_row() for i in range(100, 160)])
""")


def test_a_writer_killed_mid_upload_leaves_nothing_half_visible(url, s3_env, tmp_path):
    store = Store.create(url)
    store.append(rows(5))
    before = by_id(store.read())
    marker = tmp_path / "uploading"
    script = CRASHING_APPEND.format(tests=str(TESTS), endpoint=s3_env["AWS_ENDPOINT_URL"], marker=str(marker),
                                    url=url)
    process = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **s3_env}, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the writer never reached its part upload"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    half_sent = marker.read_text()
    time.sleep(0.3)  # let the server see the connection drop

    fs = store.storage.s3
    assert not fs.exists(half_sent)  # the half-sent object never appeared
    left = objects(url)
    assert any(n.startswith("data/trajectories/.side/") and "part-" in n for n in left)  # its side file went first
    assert ".write.lock" in left  # and its lease is still there
    reader = Store(url)
    assert by_id(reader.read()) == before and reader.check() == []
    result = CliRunner().invoke(cli, ["store", "check", url])
    assert result.exit_code == 0, result.output
    assert "every id stored once" in result.output

    # The next writer waits out the dead writer's lease, takes the lock, and removes the orphan side file.
    reader.append(rows(3, start=5))
    assert reader.count() == 8 and reader.check() == []
    sides = [n for n in objects(url) if n.startswith("data/trajectories/.side/")]
    assert sorted(sides) == sorted(f"data/trajectories/.side/{p.stem}.tool_calls.parquet" for p in reader.parts())


def test_a_failed_part_put_commits_nothing_and_releases_the_lock(url, monkeypatch):
    store = Store.create(url)
    store.append(rows(3))
    real_put = type(store.storage)._put

    def failing(self, key, data, **condition):
        if "/data/trajectories/part-" in key:
            raise OSError("connection reset by the server")
        return real_put(self, key, data, **condition)

    with monkeypatch.context() as patch, pytest.raises(OSError, match="connection reset"):
        patch.setattr(type(store.storage), "_put", failing)
        store.append(rows(3, start=3))
    assert store.count() == 3 and store.check() == []
    assert ".write.lock" not in objects(url)
    store.append(rows(3, start=3))  # nothing stuck: the lock was released, the orphan side file removed
    assert store.count() == 6


# -------------------------------------------------------------------------------------- CLI, errors


def test_cli_store_and_query_on_an_s3_url(url, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows(4)))
    runner = CliRunner()
    result = runner.invoke(cli, ["store", "append", url, str(data)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["store", "append", url, str(tmp_path / "rows.jsonl")])
    assert result.exit_code != 0 and "already holds" in result.output  # the repeated ids are refused
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows(3, start=4)))
    assert runner.invoke(cli, ["store", "append", url, str(more)]).exit_code == 0
    result = runner.invoke(cli, ["query", url, "SELECT count(*) AS n, sum(reward) AS r FROM trajectories",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"n": 7, "r": 7.0}
    result = runner.invoke(cli, ["store", "compact", url])
    assert result.exit_code == 0 and "trajectories: 2 parts -> 1" in result.output, result.output
    result = runner.invoke(cli, ["query", url, "SELECT count(DISTINCT id) AS n FROM trajectories", "--format", "csv"])
    assert result.exit_code == 0 and result.output.split() == ['"n"', "7"], result.output
    assert runner.invoke(cli, ["store", "check", url]).exit_code == 0


def test_s3_paths_that_cannot_be_a_store_are_refused_clearly(s3_env, url):
    with pytest.raises(UsageError, match="names no bucket"):
        Store("s3://")
    with pytest.raises(UsageError, match="not allowed"):
        Store(f"s3://{BUCKET}/a/../b")
    with pytest.raises(StoreError, match="not an omrl store"):
        Store(url)
    s3_storage().s3.pipe_file(f"{url.removeprefix('s3://')}/notes.txt", b"someone else's")
    with pytest.raises(StoreError, match="not empty"):
        Store.create(url)
    with pytest.raises(StoreError, match="bucket"):
        Store.create("s3://no-such-bucket-omrl/x")
    store = Store.create(url + "-ok")
    with pytest.raises(UsageError, match="text search"):
        search(store, "calculator")
    with pytest.raises(UsageError, match="local folders"), Store.staged(url + "-derived"):
        pass
    with pytest.raises(TypeError, match="not a local file"):
        open(store.path / "omrl.json")  # noqa: SIM115 - an S3 path is never taken for a local one


def test_collect_writes_straight_into_an_s3_store(url, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join((ROOT / "datasets" / "tasks" / "grid_train.jsonl").read_text().splitlines()[:6]) + "\n")
    argv = ["collect", "--env", "grid", "--tasks", str(tasks), "--policy", "scripted", "--store", url, "-n", "2",
            "--run", "s3-run"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    store = Store(url)
    assert store.count() == 12 and store.check() == []
    assert store.sql("SELECT count(DISTINCT group_id) AS g, max(n) AS n FROM groups").to_pylist() == [{"g": 6, "n": 2}]
    again = CliRunner().invoke(cli, argv)  # the same run again: every episode is already stored
    assert again.exit_code == 0, again.output
    assert store.count() == 12


def test_filter_and_export_read_an_s3_store_into_local_outputs(url, tmp_path):
    store = Store.create(url)
    store.append(rows(4) + [make_trajectory(9, reward=0.0, success=False).to_row()])
    runner = CliRunner()
    result = runner.invoke(cli, ["filter", url, "--out", str(tmp_path / "kept"), "--where", "reward > 0"])
    assert result.exit_code == 0, result.output
    kept = Store(tmp_path / "kept")
    assert kept.ids() == {f"traj-{i}" for i in range(4)}
    assert kept.manifest["lineage"][-1]["source"] == url
    result = runner.invoke(cli, ["export", url, "--out", str(tmp_path / "export")])
    assert result.exit_code == 0 and "wrote 5 trajectories" in result.output, result.output
    result = runner.invoke(cli, ["filter", url, "--out", url + "-derived"])
    assert result.exit_code == 2 and "local folders only" in result.output  # derived stores are written locally
    assert not (ROOT / "s3:").exists() and not (Path.cwd() / "s3:").exists()
    result = runner.invoke(cli, ["filter", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "does not exist" in result.output  # local paths are checked as before


def test_appends_compact_small_parts_by_themselves_on_s3(url):
    from omrl.store.layout import CompactPolicy

    store = Store.create(url)
    store.set_compact_policy(CompactPolicy(small_parts=3))
    for start in (0, 10, 20):
        store.append(rows(2, start))
    assert len(store.parts()) == 1 and store.count() == 6  # the third append merged the three small parts
    assert sum(n.startswith("data/trajectories/part-") for n in objects(url)) == 1
    assert store.check() == []


# ------------------------------------------------------------------------------ losses, named and repaired


def test_a_deleted_part_or_side_file_on_s3_is_named_by_check_and_repaired(url):
    from omrl.store.layout import CompactPolicy, side_path

    store = Store.create(url)
    store.set_compact_policy(CompactPolicy(small_parts=0))
    store.append(rows(4))
    store.append(rows(4, start=4))
    first, second = store.parts()
    fs = store.storage.s3
    fs.rm_file(store.storage.arrow_path(side_path(first)))
    problems = store.check()
    assert [p.path for p in problems] == [side_path(first)] and "missing side file" in problems[0].error
    assert store.repair().sides_rebuilt == [str(side_path(first))]
    assert store.check() == [] and store.side_files() == ([side_path(first), side_path(second)], [])

    fs.rm_file(store.storage.arrow_path(second))
    result = CliRunner().invoke(cli, ["store", "check", url])
    assert result.exit_code == 1 and second.name in result.output and "missing" in result.output
    with pytest.raises(StoreError, match=second.name):
        store.sql("SELECT count(*) FROM trajectories")
    assert store.repair().kept == [f"{second} (4 rows, missing)"]  # kept listed without accept_loss
    with pytest.raises(StoreError, match=second.name):
        store.count()
    report = store.repair(accept_loss=True)
    assert report.dropped == [f"{second} (4 rows, missing)"]
    assert store.count() == 4 and store.check() == []
