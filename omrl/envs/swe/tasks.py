"""Generate validated SWE tasks: per package, a baseline test run, then candidate bugs run in the sandbox (in
parallel), kept only when >= 1 test that passed now fails and every other test that passed still passes
(no run or test past its time limit). Resumable: each tried candidate is recorded under the cache folder.
Candidates: functions reverted to an earlier release's body first (when one is given), then omrl's modifiers'.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import omrl.envs.swe.bugs as bugs
import omrl.envs.swe.packages as packages
import omrl.envs.swe.statement as statement
import omrl.envs.swe.testrun as testrun
from omrl.envs.base import InvalidTask, Task


def generate(specs: list[str], n: int, seed: int = 0, split: str = "test", workers: int = 2,
             per_test_timeout_s: float = 10.0, max_candidates: int | None = None, report: dict | None = None,
             earlier: list[str] | None = None, modifiers: str = "omrl", progress=print,
             statement_model: statement.StatementModel | None = None) -> list[Task]:
    """About n validated tasks spread over the packages of `specs`; `earlier` names earlier releases (NAME==VERSION
    or a local sdist) of some of them, matched by name, whose function bodies are reverted to as candidates;
    `modifiers`: whose procedural modifiers make the other candidates (omrl or swesmith); `report` (if given)
    receives per package and per modifier kept/tried counts and timings; `statement_model` (if given) writes each
    new task's problem_statement (statement.py), else the template does."""
    if modifiers not in MODIFIER_SOURCES:
        raise InvalidTask(f"modifiers={modifiers!r}: one of {', '.join(MODIFIER_SOURCES)}")
    report = report if report is not None else {}
    quota = math.ceil(n / len(specs))
    fetched = [(spec, packages.fetch(spec, progress=progress)) for spec in specs]
    releases = {_normal(p.name): p for p in (packages.fetch(s, progress=progress, env=False) for s in earlier or [])}
    unmatched = [p.key for name, p in releases.items() if name not in {_normal(q.name) for _, q in fetched}]
    if unmatched:
        raise InvalidTask(f"earlier release {', '.join(unmatched)}: no --package of that name")
    tasks: list[Task] = []
    for spec, package in fetched:
        tasks += _package_tasks(spec, package, quota, seed, split, workers, per_test_timeout_s, max_candidates,
                                report.setdefault(package.key, {}), progress, releases.get(_normal(package.name)),
                                modifiers, statement_model)
    return tasks[:n] if len(tasks) > n else tasks


MODIFIER_SOURCES = ("omrl", "swesmith")


def candidates(package: packages.Package, seed: int = 0, earlier: packages.Package | None = None,
               modifiers: str = "omrl", progress=print) -> list[bugs.Candidate]:
    """The candidates tried, in order: reverts to the earlier release (if any), then the modifiers' (seeded):
    omrl's own (bugs.py) or SWE-smith's (swesmith.py, installed on first use)."""
    reverts = bugs.reverted(package.source, earlier.source) if earlier is not None else []
    if modifiers == "swesmith":
        import omrl.envs.swe.swesmith as swesmith  # only here: it may install SWE-smith

        return reverts + swesmith.candidates(package.source, swesmith.tool_folder(progress), seed=seed)
    return reverts + bugs.candidates(package.source, seed=seed)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _package_tasks(spec, package, quota, seed, split, workers, per_test_timeout_s, max_candidates, report, progress,
                   earlier=None, modifiers="omrl", statement_model=None):
    started = time.monotonic()
    state = packages.cache_dir() / "runs" / f"{package.source.name}-s{seed}-t{per_test_timeout_s:g}.jsonl"
    state.parent.mkdir(parents=True, exist_ok=True)
    tried = _read_state(state)
    baseline = tried.get("baseline")
    if baseline is None:
        run = testrun.run_tests(package, package.source, per_test_timeout_s=per_test_timeout_s, timeout_s=900)
        baseline = {"id": "baseline", "passed": sorted(run.passed()), "seconds": run.seconds,
                    "timed_out": run.timed_out}
        _append(state, baseline)
        tried["baseline"] = baseline
    report["baseline_passed"] = len(baseline["passed"])
    report["baseline_seconds"] = baseline["seconds"]
    if not baseline["passed"] or baseline["timed_out"]:
        raise InvalidTask(f"{package.key}: its tests do not run here (baseline: {len(baseline['passed'])} passed"
                          f"{', timed out' if baseline['timed_out'] else ''}); pick another package or version")
    passed = set(baseline["passed"])
    searched = time.monotonic()
    found = candidates(package, seed, earlier, modifiers, progress)
    report["candidates"], report["candidates_seconds"] = len(found), round(time.monotonic() - searched, 2)
    if earlier is not None:
        report["earlier_release"] = earlier.key
        report["earlier_release_candidates"] = sum(c.modifier == bugs.EARLIER_RELEASE for c in found)
    if max_candidates is not None:
        found = found[:max_candidates]
    lock = threading.Lock()
    stop = threading.Event()
    per_modifier = report.setdefault("modifiers", {})
    ids = {c.id for c in found}
    # the records of these candidates only: a run with other options (modifiers, --earlier) resumes its own
    resumed = [r for r in tried.values() if r["id"] in ids]
    for record in resumed:  # kept before, its statement by no model or another: the configured one writes it now
        if record.get("kept") and statement_model is not None \
                and record.get("problem_statement_source") != f"model:{statement_model.model}":
            record.pop("problem_statement_error", None)
            text, provenance = statement.write(package.name, record["FAIL_TO_PASS"], record.get("errors", ""),
                                               record["patch"], statement_model)
            record.update({"problem_statement": text, **provenance})
            _append(state, record)
    kept: list[Task] = [task_from_record(spec, package, r, split, per_test_timeout_s) for r in resumed if r.get("kept")]
    report["resumed"] = len(resumed)
    test_seconds = [baseline["seconds"] + sum(r.get("seconds") or 0.0 for r in resumed)]  # every test run's
    for record in resumed:
        counts = per_modifier.setdefault(record["modifier"], {"kept": 0, "tried": 0})
        counts["tried"] += 1
        counts["kept"] += bool(record.get("kept"))

    def attempt(candidate: bugs.Candidate) -> None:
        if stop.is_set() or candidate.id in tried:
            return
        record = validate(package, candidate, passed, per_test_timeout_s, statement_model)
        with lock:
            _append(state, record)
            test_seconds[0] += record["seconds"]
            counts = per_modifier.setdefault(candidate.modifier, {"kept": 0, "tried": 0})
            counts["tried"] += 1
            if record["kept"] and len(kept) < quota:
                counts["kept"] += 1
                kept.append(task_from_record(spec, package, record, split, per_test_timeout_s))
                progress(f"{package.key}: kept {len(kept)}/{quota} ({candidate.modifier} in {candidate.function})")
            if len(kept) >= quota:
                stop.set()

    if len(kept) < quota:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(attempt, found))
    report["kept"] = len(kept)
    report["tried"] = sum(c["tried"] for c in per_modifier.values())
    report["seconds"] = round(time.monotonic() - started, 1)
    report["test_seconds"] = round(test_seconds[0], 1)
    sources = [t.payload["problem_statement_source"] for t in kept[:quota]]
    report["problem_statements"] = {source: sources.count(source) for source in sorted(set(sources))}
    errors = [t.payload["problem_statement_error"] for t in kept[:quota] if t.payload.get("problem_statement_error")]
    if errors:
        report["problem_statement_errors"] = errors
    return kept[:quota]


def validate(package: packages.Package, candidate: bugs.Candidate, passed: set[str],
             per_test_timeout_s: float, statement_model: statement.StatementModel | None = None) -> dict:
    """Run the whole suite with the candidate's bug (in the sandbox); the record says whether it is kept (and, if so,
    carries its problem_statement, from `statement_model` or the template)."""
    run = testrun.run_tests(package, package.source, per_test_timeout_s=per_test_timeout_s, timeout_s=600,
                             patches=[candidate.bug_patch()])
    now = run.passed()
    failing = sorted(t for t in passed if run.outcomes.get(t) in ("FAILED", "ERROR"))
    missing = sorted(t for t in passed if t not in run.outcomes)
    still = sorted(passed & now)
    kept = bool(failing) and not missing and not run.timed_out and not run.per_test_timeouts \
        and len(failing) + len(still) == len(passed)
    why = ("kept" if kept else "no test failed" if not failing and not missing else
           "run timed out" if run.timed_out else "a test hit its time limit" if run.per_test_timeouts else
           f"{len(missing)} tests did not run")
    record = {"id": candidate.id, "modifier": candidate.modifier, "path": candidate.path,
              "function": candidate.function, "kept": kept, "why": why, "seconds": run.seconds}
    if kept:
        record.update({"FAIL_TO_PASS": failing, "PASS_TO_PASS": still, "bug_patch": candidate.bug_patch(),
                       "patch": candidate.fix_patch(), "fix_edit": candidate.fix_edit()})
        text, provenance = statement.write(package.name, failing, run.output, record["patch"], statement_model)
        # pytest's error lines, kept so that a rerun with another statement model can write from them
        record.update({"problem_statement": text, **provenance,
                       "errors": "\n".join(statement.error_lines(run.output))})
    return record


def task_from_record(spec: str, package: packages.Package, record: dict, split: str,
                     per_test_timeout_s: float) -> Task:
    """A kept candidate as a task with SWE-bench's fields (and what omrl needs to replay it)."""
    instance_id = f"{package.name}__{package.version}-{record['modifier']}-{record['id']}"
    payload = {"instance_id": instance_id, "package": package.name, "version": package.version,
               "repo": package.name, "base_commit": f"{package.name}=={package.version}",
               "sdist": spec, "sdist_sha256": package.sdist_sha256,
               "patch": record["patch"], "test_patch": "", "FAIL_TO_PASS": record["FAIL_TO_PASS"],
               "PASS_TO_PASS": record["PASS_TO_PASS"], "problem_statement": record["problem_statement"],
               "problem_statement_source": record.get("problem_statement_source", "template"),
               "bug_patch": record["bug_patch"], "fix_edit": record["fix_edit"], "modifier": record["modifier"],
               "path": record["path"], "function": record["function"], "per_test_timeout_s": per_test_timeout_s}
    if record.get("problem_statement_error"):
        payload["problem_statement_error"] = record["problem_statement_error"]
    return Task(id=instance_id, instruction=record["problem_statement"], answer=record["patch"], env="swe",
                split=split, payload=payload)


def _read_state(path: Path) -> dict[str, dict]:
    records = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash: that candidate is tried again
                continue
            records[record["id"]] = record
    return records


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
        out.flush()
