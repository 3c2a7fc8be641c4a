"""`omrl export`: file formats, round trips through the importers, the parquet folder as an HF dataset, push.

The push test runs the real huggingface_hub client against a small local HTTP server that implements the
four endpoints `create_repo` + `upload_folder` call (repos/create, validate-yaml, preupload, commit).
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import cli
from omrl.formats.exporters import export_store, push_to_hub
from omrl.formats.importer import load_trajectories
from omrl.schema import Annotation
from omrl.store import Store, StoreError

MESSAGE_FIELDS = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "name", "trainable")


def _messages(row) -> list[dict]:
    return [{k: m[k] for k in MESSAGE_FIELDS} for m in row["messages"]]


@pytest.fixture
def store(tmp_path) -> Store:
    s = Store.create(tmp_path / "src")
    rows = [make_trajectory(i, success=i % 2 == 0, reward=float(i % 2 == 0)).to_row() for i in range(4)]
    rows[1]["messages"][2]["trainable"] = False
    rows[2]["messages"][2]["reasoning"] = "add one"
    s.append(rows)
    s.append([Annotation(f"traj-{i}", "judge", score=0.5).to_row() for i in range(4)], table="annotations")
    return s


def test_openai_export_reimports_to_the_same_messages(store, tmp_path):
    out = export_store(store, tmp_path / "sft.jsonl", "openai")
    assert out.trajectories == 4
    lines = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert {"messages", "tools"} <= set(lines[0]) <= {"messages", "tools", "task_id", "reward", "success", "model",
                                                      "instruction"}
    call = lines[0]["messages"][2]["tool_calls"][0]
    assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)
    back = load_trajectories(tmp_path / "sft.jsonl")
    original = store.read().to_pylist()
    assert [_messages(r) for r in back] == [_messages(r) for r in original]


def test_openai_export_of_real_data_round_trips(real_data, tmp_path):
    s = Store.create(tmp_path / "s")
    rows = load_trajectories(real_data / "swe-gym_openhands_5traj.json")
    s.append(rows)
    export_store(s, tmp_path / "gym.jsonl", "openai")
    back = load_trajectories(tmp_path / "gym.jsonl")
    assert [_messages(r) for r in back] == [_messages(r) for r in s.read().to_pylist()]
    assert [json.loads(r["tools"]) for r in back] == [json.loads(r["tools"]) for r in rows]


def test_sharegpt_export_reimports(store, tmp_path):
    export_store(store, tmp_path / "sg.jsonl", "sharegpt")
    first = json.loads((tmp_path / "sg.jsonl").read_text().splitlines()[0])
    assert [t["from"] for t in first["conversations"]][:4] == ["system", "human", "gpt", "function_call"]
    back = load_trajectories(tmp_path / "sg.jsonl")
    original = store.read().to_pylist()
    assert [_messages(r) for r in back] == [_messages(r) for r in original]
    assert [r["reward"] for r in back] == [r["reward"] for r in original]


def test_jsonl_export_appends_back_unchanged(store, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["export", str(store.path), "--out", str(tmp_path / "rows.jsonl"), "--where", "success"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["store", "append", str(tmp_path / "copy"), str(tmp_path / "rows.jsonl")])
    assert result.exit_code == 0, result.output
    copy = Store(tmp_path / "copy").read().to_pylist()
    expected = [r for r in store.read().to_pylist() if r["success"]]
    assert copy == expected and len(copy) == 2


def test_parquet_export_is_a_loadable_compacted_dataset(store, tmp_path):
    store.append([make_trajectory(9).to_row()])  # a second part: the export must compact it away
    out = tmp_path / "export"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--where", "reward > 0.5"])
    assert result.exit_code == 0, result.output
    assert len(list((out / "data" / "trajectories").glob("part-*.parquet"))) == 1
    assert (out / "README.md").read_text().startswith("---\nconfigs:")
    lineage = json.loads((out / "omrl.json").read_text())["lineage"][0]
    assert lineage["op"] == "export" and lineage["where"] == "reward > 0.5"

    import datasets

    ds = datasets.load_dataset(str(out), "trajectories", split="train", cache_dir=str(tmp_path / "cache"))
    assert sorted(ds["id"]) == ["traj-0", "traj-2", "traj-9"]
    ann = datasets.load_dataset(str(out), "annotations", split="train", cache_dir=str(tmp_path / "cache"))
    assert sorted(ann["trajectory_id"]) == ["traj-0", "traj-2"]  # only the selection's annotations


def test_export_refuses_to_overwrite_and_bad_where(store, tmp_path):
    export_store(store, tmp_path / "a.jsonl")
    with pytest.raises(StoreError, match="already exists"):
        export_store(store, tmp_path / "a.jsonl")
    assert export_store(store, tmp_path / "a.jsonl", overwrite=True).trajectories == 4
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(tmp_path / "b.jsonl"),
                                      "--where", "no_such_column = 1"])
    assert result.exit_code != 0 and "no_such_column" in result.output
    assert not (tmp_path / "b.jsonl").exists()


def test_a_failed_export_leaves_no_files_behind(store, tmp_path, monkeypatch):
    def convert_fails(row):
        raise ValueError(f"cannot convert {row['id']}")

    monkeypatch.setattr("omrl.formats.exporters.to_openai_record", convert_fails)
    with pytest.raises(ValueError, match="cannot convert traj-0"):
        export_store(store, tmp_path / "out" / "sft.jsonl", "openai")
    assert list((tmp_path / "out").iterdir()) == []  # neither the export nor its temporary file


def _files(root) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too) with its bytes: what an export must leave alone."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("out, fmt, overwrite, message", [
    ("src", "traces", True, "--out {tmp}/src is the store being exported"),  # deleted the whole store
    ("src/omrl.json", None, True, "--out {tmp}/src/omrl.json is inside the store {tmp}/src"),  # broke it
    ("src/omrl.json", "openai", False, "is inside the store {tmp}/src"),
    ("src", "parquet", True, "--out {tmp}/src is the store being exported"),
    ("src", "parquet", False, "--out {tmp}/src is the store being exported"),
    ("src/data", "traces", True, "--out {tmp}/src/data is inside the store {tmp}/src"),
    ("src/new-export", "parquet", False, "is inside the store {tmp}/src"),
    ("other", "parquet", True, "--out {tmp}/other is a store that is not an earlier export"),
    ("other", "traces", True, "--out {tmp}/other is a store: --format traces would replace its files"),
    ("other/rows.jsonl", None, False, "is inside the store {tmp}/other"),
    (".", "traces", True, "holds the store"),
    (".", "parquet", True, "holds the store"),
    ("mine", "traces", True, "--out {tmp}/mine is not empty and is not an earlier traces export"),
    ("mine", "openai", True, "--out {tmp}/mine is a folder; --format openai writes one file"),
], ids=["traces over the source", "jsonl over its manifest", "openai over its manifest", "parquet over the source",
        "parquet onto the source", "traces into its data", "parquet inside it", "parquet over another store",
        "traces over another store", "jsonl inside another store", "traces over a folder holding stores",
        "parquet over a folder holding stores", "traces over a foreign folder", "openai over a folder"])
def test_export_never_writes_into_or_over_a_store_or_a_foreign_folder(store, tmp_path, out, fmt, overwrite, message):
    """The output, its parents and what it holds are checked for a store manifest before anything is written."""
    other = Store.create(tmp_path / "other")
    other.append([make_trajectory(7).to_row()])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine\n")
    before = _files(tmp_path)
    args = ["export", str(store.path), "--out", str(tmp_path / out)] + (["--format", fmt] if fmt else []) + (
        ["--overwrite"] if overwrite else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output
    assert message.format(tmp=tmp_path) in result.output
    assert _files(tmp_path) == before  # nothing written, nothing removed
    assert Store(store.path).count() == 4 and Store(other.path).count() == 1
    with pytest.raises(StoreError):
        export_store(store, tmp_path / out, fmt, overwrite=overwrite)


def test_overwrite_replaces_an_earlier_export_of_the_same_kind(store, tmp_path):
    """What --overwrite is for: an earlier traces export, an earlier parquet export (a store, not the source)."""
    export_store(store, tmp_path / "traces", "traces")
    export_store(store, tmp_path / "traces", "traces", where="success", overwrite=True)
    assert len(list((tmp_path / "traces" / "sessions").rglob("*.jsonl"))) == 2
    export_store(store, tmp_path / "ds", "parquet")
    assert export_store(store, tmp_path / "ds", "parquet", where="success", overwrite=True).trajectories == 2
    assert Store(tmp_path / "ds").count() == 2 and Store(store.path).count() == 4


# ---------------------------------------------------------------- push to a local fake Hub


class FakeHub(ThreadingHTTPServer):
    """Just enough of the Hub API for create_repo + upload_folder; records repos, files and requests."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.repos: dict[str, dict] = {}
        self.files: dict[str, dict[str, bytes]] = {}
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        self.server.requests.append(f"POST {path}")
        if path == "/api/repos/create":
            payload = json.loads(body)
            repo = f"{payload['organization']}/{payload['name']}"
            self.server.repos[repo] = payload
            self.server.files.setdefault(repo, {})
            return self._reply(200, {"url": f"{self.server.url}/datasets/{repo}"})
        if path == "/api/validate-yaml":
            return self._reply(200, {})
        parts = path.split("/")  # /api/datasets/<org>/<name>/<action>/<revision>
        if len(parts) == 7 and parts[2] == "datasets":
            repo, action = f"{parts[3]}/{parts[4]}", parts[5]
            if repo not in self.server.repos:
                return self._reply(404, {"error": "Repository not found"})
            if action == "preupload":
                files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                         for f in json.loads(body)["files"]]
                return self._reply(200, {"files": files})
            if action == "commit":
                for line in body.splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        value = item["value"]
                        self.server.files[repo][value["path"]] = base64.b64decode(value["content"])
                return self._reply(200, {"commitUrl": f"{self.server.url}/datasets/{repo}/commit/{'a' * 40}",
                                         "commitOid": "a" * 40})
        return self._reply(404, {"error": f"fake hub does not implement {path}"})


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub.constants as hf_constants

    hub = FakeHub()
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # conftest sets offline mode for everything else
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)  # what HF_ENDPOINT sets when the library loads
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    yield hub
    hub.shutdown()
    hub.server_close()


def test_export_push_uploads_the_dataset_folder(store, tmp_path, fake_hub):
    out = tmp_path / "ds"
    result = CliRunner().invoke(cli, ["export", str(store.path), "--out", str(out), "--push", "me/trajs", "--private"])
    assert result.exit_code == 0, result.output
    assert "pushed to me/trajs" in result.output
    assert fake_hub.repos["me/trajs"]["type"] == "dataset"
    assert fake_hub.repos["me/trajs"]["visibility"] == "private"
    uploaded = fake_hub.files["me/trajs"]
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
             if p.is_file() and not any(name.startswith(".") for name in p.relative_to(out).parts)}
    # Every data file and the card, byte for byte; no lock files, no hidden derived data (search index,
    # side files: rebuilt from the parts).
    assert uploaded == local
    assert "README.md" in uploaded and any(k.startswith("data/trajectories/part-") for k in uploaded)


def test_push_single_file_and_hub_errors_are_clear(store, tmp_path, fake_hub):
    export_store(store, tmp_path / "sft.jsonl", "openai")
    url = push_to_hub(tmp_path / "sft.jsonl", "me/sft", endpoint=fake_hub.url)
    assert url.endswith("a" * 40)
    assert set(fake_hub.files["me/sft"]) == {"sft.jsonl"}
    with pytest.raises(FileNotFoundError):
        push_to_hub(tmp_path / "missing", "me/x")


def test_push_in_offline_mode_is_a_clear_error(store, tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    export_store(store, tmp_path / "a.jsonl")
    with pytest.raises(StoreError, match="offline"):
        push_to_hub(tmp_path / "a.jsonl", "me/a", endpoint="http://127.0.0.1:9")


