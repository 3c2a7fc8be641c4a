"""SWE tasks from a package sdist (a tiny one built here, byte for byte the same each run, so its unpacked tree
and test environment are cached in ~/.cache/omrl): generation with validation, the swe env's tools in the
sandbox, SWE-bench's resolved, predictions export and eval, and SFT on expert trajectories.

Kept lean for CI (each sandboxed pytest run costs seconds on a loaded machine): two tasks, each test run only
where it shows something new; the scale figures (50 tasks, 6 real packages) are benchmarks/swe_bench_env.py's."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from omrl import sandbox
from omrl.cli.main import cli
from omrl.envs import generate_tasks, make_env
from omrl.envs import patch_guard as guard
from omrl.envs.base import Action, InvalidTask
from omrl.envs.swe import bugs, packages, testrun
from omrl.envs.toolenv import play_episode
from omrl.errors import UsageError
from omrl.store import Store
from tests.cases.swe_hacks import HACKS, TINYCALC, build_sdist, run_swe_hacks

REAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
AVAILABLE, WHY = sandbox.sandbox_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"bubblewrap sandbox unavailable here: {WHY}")

FILES = TINYCALC


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> str:
    return build_sdist(tmp_path_factory.mktemp("sdist"), FILES, "0.1")


class Made(list):
    """The generated tasks, with the generator's report beside them."""

    report: dict


@pytest.fixture(scope="module")
def tasks(sdist):
    report: dict = {}
    made = Made(generate_tasks("swe", n=2, packages=[sdist], report=report))
    made.report = report
    return made


def test_generation_keeps_only_bugs_the_tests_catch(tasks):
    report = tasks.report["omrl-tinycalc-0.1"]
    assert len(tasks) == 2 and report["baseline_passed"] == 4 and report["kept"] >= 2  # validated (some in flight)
    assert report["tried"] >= 2 and set(report["modifiers"]) <= set(bugs.MODIFIERS)
    for task in tasks:
        payload = task.payload
        for field in ("instance_id", "package", "version", "patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                      "problem_statement"):
            assert payload[field], field
        assert payload["package"] == "omrl-tinycalc" and payload["version"] == "0.1" and task.env == "swe"
        assert set(payload["FAIL_TO_PASS"]).isdisjoint(payload["PASS_TO_PASS"])
        assert len(payload["FAIL_TO_PASS"]) + len(payload["PASS_TO_PASS"]) == 4
        assert payload["patch"].startswith("diff --git a/src/tinycalc/__init__.py")
        assert all(test in payload["problem_statement"] for test in payload["FAIL_TO_PASS"])


def test_generation_resumes_from_what_it_tried(sdist, tasks):
    again: dict = {}
    same = generate_tasks("swe", n=2, packages=[sdist], report=again)
    assert [t.id for t in same] == [t.id for t in tasks]
    assert again["omrl-tinycalc-0.1"]["tried"] == tasks.report["omrl-tinycalc-0.1"]["tried"]  # nothing re-run


def test_a_candidate_the_tests_do_not_catch_is_dropped(sdist):
    from omrl.envs.swe import packages
    from omrl.envs.swe.tasks import validate

    package = packages.fetch(sdist, progress=lambda _: None)
    original = (package.source / "src/tinycalc/__init__.py").read_text()
    harmless = bugs.Candidate("src/tinycalc/__init__.py", "clamp", "flip_comparison",
                              original.replace('"""value limited to [low, high]."""', '"""changed."""'), original)
    looping = bugs.Candidate("src/tinycalc/__init__.py", "mean", "remove_statement",
                             original.replace("    total = 0\n", "    total = 0\n    while True:\n        pass\n"),
                             original)
    passed = {f"tests/test_calc.py::test_{name}" for name in ("clamp_low", "clamp_high", "clamp_inside", "mean")}
    assert validate(package, harmless, passed, 10.0)["why"] == "no test failed"
    assert validate(package, looping, passed, 2.0)["why"] == "a test hit its time limit"  # the per-test limit


def test_a_function_reverted_to_an_earlier_release_makes_a_task(sdist, tmp_path):
    """0.0.9's clamp forgot its upper bound: the revert is tried first (seed 1: a run of its own) and kept."""
    earlier = {**FILES, "PKG-INFO": FILES["PKG-INFO"].replace("0.1", "0.0.9"),
               "src/tinycalc/__init__.py": FILES["src/tinycalc/__init__.py"].replace(
                   "    if value > high:\n        return high\n", "")}
    old = build_sdist(tmp_path, earlier, "0.0.9")
    runner = CliRunner()
    made = runner.invoke(cli, ["tasks", "generate", "swe", "--package", sdist, "--earlier", old, "--n", "1",
                               "--seed", "1", "--option", "max_candidates=1", "--out", str(tmp_path / "t.jsonl")])
    assert made.exit_code == 0, made.output
    [task] = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    payload = task["payload"] if isinstance(task["payload"], dict) else json.loads(task["payload"])
    assert payload["modifier"] == bugs.EARLIER_RELEASE and payload["function"] == "clamp"
    assert payload["FAIL_TO_PASS"] == ["tests/test_calc.py::test_clamp_high"] and len(payload["PASS_TO_PASS"]) == 3
    other = build_sdist(tmp_path, {**earlier, "PKG-INFO": "Metadata-Version: 2.1\nName: other\nVersion: 1\n"}, "1")
    refused = runner.invoke(cli, ["tasks", "generate", "swe", "--package", sdist, "--earlier", other, "--n", "1",
                                  "--out", str(tmp_path / "u.jsonl")])
    assert refused.exit_code != 0 and "no --package of that name" in refused.output, refused.output


def test_swe_smith_modifiers_make_a_task(sdist):
    """SWE-smith 0.0.9 installed in its own folder (once; pip, wheels only), its modifiers run by the worker: with
    seed 3 it removes one of clamp's conditions, and the validated task names SWE-smith's modifier."""
    report: dict = {}
    [task] = generate_tasks("swe", n=1, seed=3, packages=[sdist], modifiers="swesmith", max_candidates=1,
                            report=report)
    assert task.payload["modifier"] == "func_pm_remove_cond" and task.payload["function"] == "clamp"
    assert report["omrl-tinycalc-0.1"]["modifiers"] == {"func_pm_remove_cond": {"kept": 1, "tried": 1}}
    assert len(task.payload["FAIL_TO_PASS"]) == 1 and len(task.payload["PASS_TO_PASS"]) == 3
    with pytest.raises(InvalidTask, match="one of omrl, swesmith"):
        generate_tasks("swe", n=1, packages=[sdist], modifiers="other")


def test_the_fix_through_the_tools_resolves_and_an_empty_submission_does_not(tasks):
    """One task (collect below plays the expert on every task): its fix applied with the env's tools, then nothing."""
    env = make_env("swe")
    try:
        task = tasks[0]
        total, last, steps = play_episode(env, task)
        assert total == 1.0 and last.info["resolved"] and last.info["model_patch"].startswith("diff --git")
        assert steps == 3 and last.info["fail_to_pass"] == "{0}/{0}".format(len(task.payload["FAIL_TO_PASS"]))
        env.reset(task)
        empty = env.step(Action(tool="submit"))
        assert empty.reward == 0.0 and not empty.info["resolved"] and empty.info["model_patch"] == ""
        assert empty.info["fail_to_pass"] == f"0/{len(task.payload['FAIL_TO_PASS'])}"
    finally:
        env.close()


def test_the_tools_work_inside_the_sandbox(tasks):
    env = make_env("swe", command_timeout_s=20)
    try:
        env.reset(tasks[0])
        view = env.step(Action(tool="view", arguments={"path": "src/tinycalc/__init__.py", "start_line": 9}))
        assert view.observation.splitlines()[0].strip().startswith("9") and "lines in all" in view.observation
        found = env.step(Action(tool="search", arguments={"text": "def mean"}))
        assert "src/tinycalc/__init__.py:10:def mean" in found.observation
        where = env.step(Action(tool="bash", arguments={"command": "pwd; id -u; ls /root 2>&1 | head -1"}))
        assert where.observation.split()[:2] == ["/testbed", "65534"]  # the sandbox's user, its own checkout
        bad = env.step(Action(tool="str_replace", arguments={"path": "src/tinycalc/__init__.py", "old_str": "zzz",
                                                             "new_str": "y"}))
        assert bad.info["invalid_action"] and "occurs 0 times" in bad.observation
    finally:
        env.close()


@pytest.fixture(scope="module")
def collected(tasks, tmp_path_factory):
    """The scripted expert's episodes of the tasks, through `omrl collect`: (tasks file, store)."""
    from omrl.tasks import write_tasks

    folder = tmp_path_factory.mktemp("collect")
    write_tasks(tasks, folder / "swe.jsonl")
    result = CliRunner().invoke(cli, ["collect", "--env", "swe", "--tasks", str(folder / "swe.jsonl"), "--policy",
                                      "scripted", "--store", str(folder / "s"), "--no-progress", "--concurrency", "2"])
    assert result.exit_code == 0 and "success 100.0%" in result.output, result.output
    rows = Store(folder / "s").read().to_pylist()
    assert sorted(r["task_id"] for r in rows) == sorted(t.id for t in tasks) and all(r["success"] for r in rows)
    return folder / "swe.jsonl", folder / "s"


def test_collect_export_predictions_and_eval_them(tasks, collected, tmp_path):
    tasks_file, store = collected
    runner = CliRunner()
    exported = runner.invoke(cli, ["export", str(store), "--out", str(tmp_path / "preds.jsonl"),
                                   "--format", "swebench-predictions"])
    assert exported.exit_code == 0, exported.output
    predictions = [json.loads(line) for line in (tmp_path / "preds.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in predictions) == sorted(t.id for t in tasks)
    assert all(p["model_name_or_path"] == "scripted" and p["model_patch"].startswith("diff --git")
               for p in predictions)
    scored = runner.invoke(cli, ["eval", "--env", "swe", "--tasks", str(tasks_file), "--predictions",
                                 str(tmp_path / "preds.jsonl")])
    assert scored.exit_code == 0 and "resolved 2/2" in scored.output, scored.output
    # SWE-bench's JSON list form, one prediction (emptied): only it is scored
    (tmp_path / "worse.json").write_text(json.dumps([{**predictions[0], "model_patch": ""}]))
    worse = runner.invoke(cli, ["eval", "--env", "swe", "--tasks", str(tasks_file), "--predictions",
                                str(tmp_path / "worse.json")])
    assert worse.exit_code == 0 and "resolved 0/1" in worse.output, worse.output
    assert "1 tasks without a prediction" in worse.output
    refused = runner.invoke(cli, ["eval", "--env", "math", "--tasks", str(tasks_file), "--predictions",
                                  str(tmp_path / "worse.json")])
    assert refused.exit_code != 0 and "does not score predictions" in refused.output
    rows = Store(store).read().to_pylist()
    info = json.loads(rows[0]["turns"][-1]["info"])
    assert info["resolved"] and info["fail_to_pass"].split("/")[0] == info["fail_to_pass"].split("/")[1]


def test_a_task_without_its_fields_is_invalid(tasks):
    env = make_env("swe")
    broken = tasks[0].__class__(id="x", instruction="x", env="swe", payload={"sdist": tasks[0].payload["sdist"]})
    with pytest.raises(InvalidTask, match="payload.bug_patch"):
        env.reset(broken)
    env.close()
    with pytest.raises(InvalidTask, match="--package"):
        generate_tasks("swe", n=2)


@pytest.mark.slow
def test_sft_runs_on_expert_swe_trajectories(collected, tmp_path):
    """A smoke test: the tiny model trains on the scripted expert's SWE episodes end to end (no learning claim)."""
    pytest.importorskip("trl")
    from omrl.models.tiny import cached_tiny_model
    from omrl.train.algorithms.sft import train_sft
    from omrl.train.config.sft import SFTRecipe

    result = train_sft(SFTRecipe(model=str(cached_tiny_model()), store=str(collected[1]),
                                 output_dir=str(tmp_path / "o"), batch_size=2, max_steps=1, logging_steps=1,
                                 max_length=2048,  # the tiny model's whole context: SWE turns are long
                                 quiet=True))
    assert len(result.losses) == 1 and result.losses[0] > 0 and result.checkpoint.is_dir()


def test_a_model_writes_the_problem_statement_from_the_failing_tests(sdist, tmp_path):
    """`--option statement_model=... statement_base_url=...`: the model (a real HTTP server speaking OpenAI's protocol)
    is asked with the failing tests and their errors, never the patch, and its reply becomes the statement."""
    from omrl.testing.openai_server import FakeOpenAIServer

    issue = "clamp() gives the wrong answer for values outside its range; see the failing test."
    writer = f"writer-{time.time_ns()}"  # a model new to the cache: a rerun (resumed) has it rewrite the statement
    with FakeOpenAIServer(default={"content": issue}) as server:
        made = CliRunner().invoke(cli, [
            "tasks", "generate", "swe", "--package", sdist, "--n", "1", "--seed", "5", "--out", str(tmp_path / "t.jsonl"),
            "--option", "max_candidates=4", "--option", "workers=1", "--option", f"statement_model={writer}",
            "--option", f"statement_base_url={server.base_url}"])
        assert made.exit_code == 0, made.output
        requests = list(server.requests)
    [task] = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    payload = task["payload"] if isinstance(task["payload"], dict) else json.loads(task["payload"])
    assert payload["problem_statement"] == issue and task["instruction"] == issue
    assert payload["problem_statement_source"] == f"model:{writer}" and "problem_statement_error" not in payload
    assert len(requests) == 1 and requests[0]["model"] == writer
    prompt = requests[0]["messages"][-1]["content"]
    assert all(test in prompt for test in payload["FAIL_TO_PASS"])
    fix_lines = [line[1:].strip() for line in payload["patch"].splitlines()
                 if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]
    assert fix_lines and not any(line in prompt for line in fix_lines)  # the fix never reaches the model
    refused = CliRunner().invoke(cli, ["tasks", "generate", "swe", "--package", sdist, "--n", "1", "--out",
                                       str(tmp_path / "u.jsonl"), "--option", "statement_model=writer"])
    assert refused.exit_code != 0 and "statement_base_url" in refused.output


def test_a_statement_that_leaks_the_fix_or_a_failed_call_falls_back_to_the_template():
    from omrl.envs.swe import statement
    from omrl.testing.openai_server import FakeOpenAIServer

    patch = ("diff --git a/src/m.py b/src/m.py\n--- a/src/m.py\n+++ b/src/m.py\n@@ -1,3 +1,4 @@\n def f(x):\n"
             "+    if x > high:\n+        return high\n     return x\n")
    output = "E       assert 11 == 10\nFAILED tests/test_m.py::test_high - assert 11 == 10\n"
    failing = ["tests/test_m.py::test_high"]
    template = bugs.problem_statement("m", failing, output)
    with FakeOpenAIServer() as server:
        model = statement.StatementModel("writer", server.base_url, max_retries=0)
        server.enqueue({"content": "f(11) returns 11. Fix:   if x >  high:  return high"}, {"content": "  "},
                       {"status": 401}, {"content": "f(11) should give 10 but gives 11."})
        leaked, why = statement.write("m", failing, output, patch, model)
        assert leaked == template and why["problem_statement_source"] == "template"
        assert "quotes the fix's changed line 'if x > high:'" in why["problem_statement_error"]
        empty, why = statement.write("m", failing, output, patch, model)
        assert empty == template and "empty" in why["problem_statement_error"]
        failed, why = statement.write("m", failing, output, patch, model)
        assert failed == template and "LLMStatusError: HTTP 401" in why["problem_statement_error"]  # recorded
        good, why = statement.write("m", failing, output, patch, model)
        assert good == "f(11) should give 10 but gives 11." and why == {"problem_statement_source": "model:writer"}
        assert all("if x > high" not in json.dumps(r["messages"]) for r in server.requests)
        assert "assert 11 == 10" in server.requests[0]["messages"][-1]["content"]
    assert statement.write("m", failing, output, patch, None) == (template, {"problem_statement_source": "template"})


REPO = {"src/tinyrepo/__init__.py": "def clamp(value, low, high):\n    if value < low:\n        return low\n    return value\n",
        "tests/test_calc.py": "from tinyrepo import clamp\n\n\ndef test_clamp_low():\n    assert clamp(-1, 0, 9) == 0\n"}
FIX = ("diff --git a/src/tinyrepo/__init__.py b/src/tinyrepo/__init__.py\n--- a/src/tinyrepo/__init__.py\n"
       "+++ b/src/tinyrepo/__init__.py\n@@ -1,4 +1,6 @@\n def clamp(value, low, high):\n     if value < low:\n"
       "         return low\n+    if value > high:\n+        return high\n     return value\n")
TEST_PATCH = ("diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
              "@@ -3,3 +3,7 @@ from tinyrepo import clamp\n \n def test_clamp_low():\n     assert clamp(-1, 0, 9) == 0\n"
              "+\n+\n+def test_clamp_high():\n+    assert clamp(10, 0, 9) == 9\n")


def crafted_instance(folder) -> tuple[dict, str]:
    """A SWE-bench row of a tiny repository (committed with fixed dates, so its commit is the same each run) and the
    folder holding its checkout, named by instance_id as `--source` expects."""
    import os
    import subprocess

    checkout = folder / "checkouts" / "tiny__tinyrepo-1"
    for name, text in REPO.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    dates = {"GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], cwd=checkout, check=True, env={**os.environ, **dates})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    row = {"repo": "tiny/tinyrepo", "instance_id": "tiny__tinyrepo-1", "base_commit": commit, "patch": FIX,
           "test_patch": TEST_PATCH, "problem_statement": "clamp() ignores its upper bound.", "version": "0.1",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_clamp_high"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_clamp_low"])}
    return row, str(folder / "checkouts")


def test_an_imported_swe_bench_instance_runs_from_its_source_tree(tmp_path):
    """`omrl tasks import --source DIR`: the checkout runs in --env swe; the agent sees the tree without the
    test_patch, which is applied at scoring (SWE-bench's order); the fix through bash resolves it, nothing does not."""
    from omrl.tasks import load_tasks

    row, source = crafted_instance(tmp_path)
    (tmp_path / "rows.json").write_text(json.dumps([row]))
    made = CliRunner().invoke(cli, ["tasks", "import", str(tmp_path / "rows.json"), "--source", source, "--out",
                                    str(tmp_path / "t.jsonl")])
    assert made.exit_code == 0, made.output
    [task] = load_tasks(tmp_path / "t.jsonl")
    assert task.env == "swe" and task.payload["source"].endswith("tiny__tinyrepo-1")
    assert task.payload["FAIL_TO_PASS"] == ["tests/test_calc.py::test_clamp_high"]
    env = make_env("swe")
    try:
        env.reset(task)
        seen = env.step(Action(tool="bash", arguments={"command": "cat tests/test_calc.py; ls -a"}))
        assert "test_clamp_low" in seen.observation and "test_clamp_high" not in seen.observation
        assert ".omrl-bug.patch" not in seen.observation
        total, last, steps = play_episode(env, task)
        assert total == 1.0 and last.info["resolved"] and steps == 2  # bash (git apply), submit
        assert last.info["fail_to_pass"] == "1/1" and last.info["pass_to_pass"] == "1/1"
        env.reset(task)
        empty = env.step(Action(tool="submit"))
        assert empty.reward == 0.0 and empty.info["fail_to_pass"] == "0/1" and empty.info["pass_to_pass"] == "1/1"
    finally:
        env.close()


def test_an_swe_bench_instance_without_its_source_tree_is_refused(tmp_path):
    row, source = crafted_instance(tmp_path)
    (tmp_path / "rows.json").write_text(json.dumps([row]))
    runner = CliRunner()
    plain = runner.invoke(cli, ["tasks", "import", str(tmp_path / "rows.json"), "--env", "swe", "--out",
                                str(tmp_path / "t.jsonl")])
    assert plain.exit_code == 0, plain.output
    from omrl.tasks import load_tasks

    [task] = load_tasks(tmp_path / "t.jsonl")
    env = make_env("swe")
    with pytest.raises(InvalidTask, match=r"^SWE-bench instance tiny__tinyrepo-1: no source tree; import it with "
                                          r"`omrl tasks import --format swebench --source DIR`") as refused:
        env.reset(task)
    assert "\n" not in str(refused.value)
    (tmp_path / "empty").mkdir()
    missing = runner.invoke(cli, ["tasks", "import", str(tmp_path / "rows.json"), "--source", str(tmp_path / "empty"),
                                  "--out", str(tmp_path / "u.jsonl")])
    assert missing.exit_code != 0 and "tiny__tinyrepo-1: no checkout" in missing.output, missing.output
    moved = task.__class__(id=task.id, instruction="x", env="swe",
                           payload={**task.payload, "source": str(tmp_path / "checkouts" / task.id),
                                    "base_commit": "0" * 40})
    with pytest.raises(InvalidTask, match="checked out at .*, not at the instance's base_commit 000000000000"):
        env.reset(moved)
    env.close()


@pytest.mark.skipif(not (REAL_DATA / "swe-bench-lite_5tasks.json").exists(), reason="shared real data absent")
def test_real_swe_bench_lite_rows_are_refused_by_name_without_their_checkouts(tmp_path):
    from omrl.tasks import load_tasks

    made = CliRunner().invoke(cli, ["tasks", "import", str(REAL_DATA / "swe-bench-lite_5tasks.json"), "--env", "swe",
                                    "--out", str(tmp_path / "lite.jsonl")])
    assert made.exit_code == 0, made.output
    tasks = load_tasks(tmp_path / "lite.jsonl")
    env = make_env("swe")
    for task in tasks:
        with pytest.raises(InvalidTask, match=f"^SWE-bench instance {task.id}: no source tree.*--source DIR"):
            env.reset(task)
    django = next(t for t in tasks if t.id == "django__django-16255")
    named = django.__class__(id=django.id, instruction="x", env="swe", payload={**django.payload, "source": "/x"})
    with pytest.raises(InvalidTask, match="its tests are not pytest node ids"):
        env.reset(named)
    env.close()


# ------------------------------------------------------------------------------------ a scorer that cannot be fooled


def test_no_reward_hack_is_scored_and_the_honest_fix_still_is(tasks):
    """Every hack of the catalogue (tests rewritten, conftest/sitecustomize hooks, a shadowed plugin, a config
    that reroutes imports, printed or forged results, objects equal to anything, pytest patched) ends unresolved;
    the honest fix resolves, also when it edits a test on the way (that edit is dropped and named)."""
    results = run_swe_hacks(tasks[0])
    assert results.tried == [h.name for h in HACKS] and len(results.tried) >= 12
    assert results.scored == [], {name: results.details[name] for name in results.scored}
    assert results.honest_resolved and results.honest_with_test_edit_resolved
    assert "conftest.py" in results.details["conftest_root"]["dropped_from_patch"]
    assert results.details["always_equal"]["forgery_signs"]


def test_the_guard_drops_protected_sections_whatever_the_header_looks_like():
    patch = ("diff --git a/src/pkg/core.py b/src/pkg/core.py\n--- a/src/pkg/core.py\n+++ b/src/pkg/core.py\n"
             "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
             'diff --git "a/tests/t\\303\\251st_x.py" "b/tests/t\\303\\251st_x.py"\n'
             '--- "a/tests/t\\303\\251st_x.py"\n+++ "b/tests/t\\303\\251st_x.py"\n@@ -1 +1 @@\n-a\n+b\n'
             "diff --git a/src/pkg/util.py b/src/pkg/conftest.py\nsimilarity index 100%\n"
             "rename from src/pkg/util.py\nrename to src/pkg/conftest.py\n"
             "diff --git a/src/pkg/__pycache__/core.cpython-311.pyc b/src/pkg/__pycache__/core.cpython-311.pyc\n"
             "new file mode 100644\nGIT binary patch\nliteral 3\nKcmZ>\n\n"
             "diff --git a/json.py b/json.py\nnew file mode 100644\n--- /dev/null\n+++ b/json.py\n@@ -0,0 +1 @@\n+x\n"
             "diff --git a/.omrl-guard b/.omrl-guard\n--- a/.omrl-guard\n+++ b/.omrl-guard\n@@ -1 +1 @@\n-a\n+b\n")
    original = ["src/pkg/core.py", "src/pkg/util.py", "tests/tést_x.py", "setup.py"]
    kept, dropped = guard.sanitise(patch, original)
    assert kept.startswith("diff --git a/src/pkg/core.py") and kept.count("diff --git") == 1
    assert dropped == sorted(["tests/tést_x.py", "src/pkg/conftest.py", "src/pkg/__pycache__/core.cpython-311.pyc",
                              "json.py",  # a new top-level module could shadow the stdlib's
                              ".omrl-guard"])  # the scorer's own rule, copied beside the tree
    assert guard.forgery_signs(kept) == [] and guard.forgery_signs("+import _pytest\n+ x = 1\n") == ["import _pytest"]


def test_results_come_from_exactly_one_junit_report():
    one = (b'<testsuites><testsuite><testcase classname="tests.test_a" name="test_x" file="tests/test_a.py"/>'
           b'<testcase classname="tests.test_a.TestB" name="test_y[1-2]" file="tests/test_a.py"><failure/></testcase>'
           b'</testsuite></testsuites>')
    outcomes, error = testrun.read_junit(one)
    assert outcomes == {"tests/test_a.py::test_x": "PASSED", "tests/test_a.py::TestB::test_y[1-2]": "FAILED"}
    assert error == ""
    for report in (one + one, b"", None, b"PASSED tests/test_a.py::test_x"):
        outcomes, error = testrun.read_junit(report)
        assert outcomes == {} and error


def test_a_hostile_sdist_or_view_argument_is_one_line_not_a_traceback(tmp_path, tasks):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        link = tarfile.TarInfo("evil-1.0/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
        tar.addfile(link)
    (tmp_path / "evil-1.0.tar.gz").write_bytes(data.getvalue())
    with pytest.raises(UsageError, match="cannot unpack it safely"):
        packages.fetch(str(tmp_path / "evil-1.0.tar.gz"), progress=lambda _: None)
    assert packages._safe_name("../../x y;rm -rf") == "x-y-rm-rf" and packages._safe_name("1.0+local") == "1.0+local" and packages._safe_name("..") == "unnamed"
    env = make_env("swe")
    try:
        env.reset(tasks[0])
        for line in (float("nan"), float("-inf"), "Infinity", "abc", True):
            step = env.step(Action(tool="view", arguments={"path": "src/tinycalc/__init__.py", "start_line": line}))
            assert step.info["invalid_action"] and "start_line" in step.observation
        step = env.step(Action(tool="view", arguments={"path": "src/tinycalc/__init__.py", "start_line": "9"}))
        assert step.observation.split()[0] == "9"
    finally:
        env.close()


def test_sdists_come_from_the_index_as_files_never_built(monkeypatch, tmp_path):
    """The index's page (PEP 503 HTML here, a file:// index) names the file; it is fetched and hash-checked, and
    pip (whose `download` would run the package's setup.py to read its metadata) is not asked for it."""
    archive = build_sdist(tmp_path, {**FILES, "setup.py": "raise SystemExit('setup.py ran')\n"}, "0.3")
    digest = hashlib.sha256(Path(archive).read_bytes()).hexdigest()
    page = tmp_path / "index" / "omrl-tinycalc"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="{Path(archive).as_uri()}#sha256={digest}">omrl-tinycalc-0.3.tar.gz'
                                     "</a>", encoding="utf-8")
    monkeypatch.setenv("OMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(packages, "index_urls", lambda: [(tmp_path / "index").as_uri()])
    got = packages._download("omrl-tinycalc", "0.3", progress=lambda _: None)
    assert got.read_bytes() == Path(archive).read_bytes()
    (page / "index.html").write_text(f'<a href="{Path(archive).as_uri()}#sha256={"0" * 64}">omrl-tinycalc-0.4.tar.gz'
                                     "</a>", encoding="utf-8")
    with pytest.raises(UsageError, match="no sdist of 0.5"):
        packages._download("omrl-tinycalc", "0.5", progress=lambda _: None)


def test_work_folders_a_killed_run_left_are_cleaned_by_the_next_one(tmp_path, monkeypatch):
    """A run killed with SIGKILL leaves its omrl-swe-run-* folder; the next process's first test run removes
    it, and never one whose owner still holds its lock (nor one just made, whose owner may not hold it yet)."""
    import fcntl
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - 3600
    left, live, fresh = (tmp_path / f"omrl-swe-run-{name}" for name in ("left", "live", "fresh"))
    for folder in (left, live, fresh):
        folder.mkdir()
        (folder / ".omrl-lock").write_text("")
    for folder in (left, live):
        os.utime(folder / ".omrl-lock", (old, old))
    holder = os.open(live / ".omrl-lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        removed = testrun.sweep_stale_work_folders.__wrapped__()
    finally:
        os.close(holder)
    assert removed == ["omrl-swe-run-left"] and not left.exists() and live.exists() and fresh.exists()
