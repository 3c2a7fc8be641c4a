"""Secrets omrl was given never land in a store, a log or the console: one redaction (omrl.schema.redact) everywhere."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import cli
from omrl.llm.client import LLMClient, LLMStatusError
from omrl.schema import normalize_annotation, normalize_trajectory
from omrl.schema.redact import display_url, redact, remember_secret, remember_url
from omrl.store import Store
from omrl.testing.openai_server import FakeOpenAIServer
from tests.cases.leaks import run_secret_leaks


def test_redact_hides_given_keys_url_credentials_and_bearer_tokens(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "env-key-4f8a9b0c1d")
    remember_secret("flag-key-77aa88bb99")
    remember_url("http://ann:url-pw-123456@example.test/v1")
    text = ("401 for Bearer abc.def-123456 and Basic YW5uOnVybC1wdy0xMjM0NTY= at https://ann:url-pw-123456@h/v1; "
            "keys env-key-4f8a9b0c1d flag-key-77aa88bb99 url-pw-123456 sk-proj-a1b2c3d4e5f6g7")
    shown = redact(text)
    for secret in ("abc.def-123456", "YW5uOnVybC1wdy0xMjM0NTY=", "env-key-4f8a9b0c1d", "flag-key-77aa88bb99",
                   "url-pw-123456", "a1b2c3d4e5f6g7"):
        assert secret not in shown, shown
    assert shown.startswith("401 for Bearer *** and Basic *** at https://***@h/v1")
    # Ordinary words, placeholders and URLs without credentials pass untouched.
    for plain in ("Basic authentication failed", "key EMPTY", "http://127.0.0.1:8000/v1", "sk-learn", "git@github.com"):
        assert redact(plain) == plain
    assert display_url("http://u:p@host:8/v1?x=1") == "http://***@host:8/v1?x=1"


def test_the_client_remembers_its_key_and_errors_and_stored_rows_are_redacted():
    LLMClient("http://bo:pw-planted-0001@127.0.0.1:9/v1", "sk-planted-client-9999abc")
    error = LLMStatusError("HTTP 401: got sk-planted-client-9999abc and pw-planted-0001", 1, 401)
    assert "planted" not in str(error)
    row = normalize_trajectory({"id": "t", "task_id": "x", "status": "policy_error",
                                "error": "echo: Bearer sk-planted-client-9999abc",
                                "metadata": {"note": "pw-planted-0001"}})
    assert row["error"] == "echo: Bearer ***" and "planted" not in row["metadata"]
    annotation = normalize_annotation({"trajectory_id": "t", "annotator": "j", "status": "error",
                                       "error": "HTTP 401 sk-planted-client-9999abc"})
    assert "planted" not in annotation["error"]


def test_an_echoing_endpoint_leaves_no_planted_key_in_stores_or_output(tmp_path):
    report = run_secret_leaks(tmp_path / "work", in_process=True)
    assert report.commands == 6 and not report.errors, report.errors
    assert report.found == 0, report.places
    # The commands did meet the endpoint: its refusals are stored, with the key masked.
    store = Store(tmp_path / "work" / "store")
    errors = [r["error"] for r in store.read("trajectories", ["error"]).to_pylist()]
    assert errors and all("401" in e and "***" in e for e in errors)
    judged = [r["error"] for r in store.read("annotations", ["error"]).to_pylist()]
    assert judged and all("***" in e for e in judged)


def test_augment_does_not_print_the_key(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([make_trajectory(i).to_row() for i in range(2)])
    with FakeOpenAIServer(default={"status": 401, "echo": True}) as server:
        url = server.base_url.replace("http://", "http://me:url-secret-5150@")
        result = CliRunner().invoke(cli, ["augment", str(store.path), "--out", str(tmp_path / "a"), "--op",
                                          "paraphrase", "--base-url", url, "--model", "m",
                                          "--api-key", "sk-augment-key-24680xyz"])
    assert result.exit_code == 0, result.output
    assert "failed" in result.output and "401" in result.output
    assert "sk-augment-key-24680xyz" not in result.output and "url-secret-5150" not in result.output
    manifest = json.dumps(json.loads((tmp_path / "a" / "omrl.json").read_text()))
    assert "url-secret-5150" not in manifest and "sk-augment-key-24680xyz" not in manifest
