"""Secret leaks: run omrl's commands against an endpoint that echoes the key it was sent, then look for the
planted keys everywhere they could land.

    report = run_secret_leaks(workdir)     # report.found: planted keys seen; report.places: where

The keys are planted the ways a user gives them: OPENAI_API_KEY and HF_TOKEN in the environment, `--api-key`
on the command line, and a user and password inside `--base-url`. The endpoint (omrl.testing.openai_server,
on 127.0.0.1) answers every request with a 401 whose message repeats the request's Authorization header,
as careless proxies do. Then collect, eval, annotate with a judge and augment with the paraphraser run as
`python -m omrl` subprocesses, and every byte they leave is searched: their stdout and stderr, every file
of the stores (Parquet read back through Arrow, so compressed text is searched too; the dataset card,
omrl.json, caches) for each key as written, URL-quoted and in the base64 form HTTP Basic auth sends.

Used by tests/test_secrets.py and benchmarks/chaos.py (`secrets_stored`, target 0).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from omrl.testing.openai_server import FakeOpenAIServer

ENV_KEY = "sk-planted-env-7a1c9e2b4d6f8a0c"
HF_KEY = "hf_plantedHubToken93xq7ZkL2mN"
FLAG_KEY = "sk-planted-flag-3e5g7i9k1m3o5q7s"
URL_USER, URL_PASSWORD = "planted-user", "planted-url-pw-48213"
PLANTED = {"OPENAI_API_KEY": ENV_KEY, "HF_TOKEN": HF_KEY, "--api-key": FLAG_KEY, "--base-url password": URL_PASSWORD}
COMMAND_TIMEOUT_S = 300


@dataclass
class LeakReport:
    commands: int = 0
    found: int = 0  # (planted key, place) pairs where a key was seen
    places: list[str] = field(default_factory=list)  # "<key name> in <place>"
    errors: list[str] = field(default_factory=list)  # commands that crashed (a traceback is a finding too)

    def to_dict(self) -> dict[str, Any]:
        return {"commands": self.commands, "secrets_stored": self.found, "places": self.places,
                "errors": self.errors}


def _forms(value: str) -> list[str]:
    """How a key may appear: as is, URL-quoted, and base64 as HTTP Basic auth carries it."""
    basic = base64.b64encode(f"{URL_USER}:{value}".encode()).decode()
    return list(dict.fromkeys([value, quote(value, safe=""), base64.b64encode(value.encode()).decode(), basic]))


def _search(text: str, place: str, report: LeakReport) -> None:
    for name, value in PLANTED.items():
        if any(form in text for form in _forms(value)):
            report.found += 1
            report.places.append(f"{name} in {place}")


def _file_text(path: Path) -> str:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return json.dumps(pq.read_table(path).to_pylist(), default=str, ensure_ascii=False)
        except Exception as exc:  # a part that does not read is searched as bytes below, and reported
            return f"<unreadable parquet: {exc}> " + path.read_bytes().decode("latin-1")
    return path.read_bytes().decode("utf-8", "replace")


def _run(argv: list[str], cwd: Path, env: dict[str, str], report: LeakReport, in_process: bool) -> None:
    if in_process:  # click's runner: the same consoles and warnings, captured, without a start-up per command
        from click.testing import CliRunner

        from omrl.cli.main import cli

        here = os.getcwd()
        os.chdir(cwd)
        try:
            result = CliRunner().invoke(cli, argv, env=env)
        finally:
            os.chdir(here)
        stdout, stderr = result.output, "".join(_traceback(result.exc_info))
    else:
        done = subprocess.run([sys.executable, "-m", "omrl", *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S)
        stdout, stderr = done.stdout, done.stderr
    report.commands += 1
    name = argv[0]
    _search(stdout, f"stdout of omrl {name}", report)
    _search(stderr, f"stderr of omrl {name}", report)
    if "Traceback" in stderr:
        report.errors.append(f"omrl {name} crashed: {stderr[-300:]}")


def _traceback(exc_info: Any) -> list[str]:
    import traceback

    if not exc_info or exc_info[0] is SystemExit:
        return []
    return ["Traceback (in process)\n", *traceback.format_exception(*exc_info)]


def run_secret_leaks(workdir: str | Path, in_process: bool = False) -> LeakReport:
    """Plant the keys, run the commands against an echoing endpoint, count where a key shows up.

    in_process: run the commands through click's runner in this process (faster; tests) instead of as
    `python -m omrl` subprocesses."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = LeakReport()
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OPENAI_API_KEY": ENV_KEY, "HF_TOKEN": HF_KEY, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "COLUMNS": "200"}
    env.pop("OPENAI_BASE_URL", None)
    with FakeOpenAIServer(default={"status": 401, "echo": True}) as server:
        plain = server.base_url
        with_credentials = plain.replace("http://", f"http://{URL_USER}:{URL_PASSWORD}@", 1)
        tasks = ["--env", "math", "--tasks", "shipped:math_arith", "--limit", "2", "--policy", "openai:m",
                 "--no-progress", "--model-call-timeout", "10"]
        judge = str(repo / "recipes" / "judges" / "grid_goal.yaml")
        for argv in (["collect", *tasks, "--base-url", plain, "--store", "store"],
                     ["eval", *tasks, "--base-url", with_credentials, "--store", "store"],
                     ["annotate", "store", "--judge", judge, "--judge-model", "m", "--base-url", plain,
                      "--api-key", FLAG_KEY],
                     ["annotate", "store", "--judge", judge, "--judge-model", "m", "--base-url", with_credentials,
                      "--redo"],
                     ["augment", "store", "--out", "augmented", "--op", "paraphrase", "--base-url", with_credentials,
                      "--model", "m", "--api-key", FLAG_KEY],
                     ["query", "store", "SELECT status, error FROM trajectories UNION ALL "
                                        "SELECT status, error FROM annotations"]):
            _run(argv, work, env, report, in_process)
    for path in sorted(p for p in work.rglob("*") if p.is_file()):
        _search(_file_text(path), str(path.relative_to(work)), report)
    return report
