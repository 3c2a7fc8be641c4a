"""Chaos: SIGKILL loops over the seven store-writing commands, a fuzz corpus for every reader, and the
query and sandbox escape suites. Prints one JSON line.

Targets (issue 8): lost = 0 and duplicated = 0 over >= 50 kills spread across collect, append, import,
filter, compact, annotate and iterate; fuzz_unlocated_errors = 0 over >= 60 fuzz cases;
query_escapes = 0 and sandbox_escapes = 0 over every listed case; sandbox_memory_escapes = 0 (issue 21: forked
children, memfds and tmpfs writes held under one total cap; sandbox_memory_cap says how: cgroup2, cgroup1, polling);
secrets_stored = 0 (issue 21: keys planted in the environment, flags and URL, found in no store, log or
console output after a run against an endpoint that echoes them); viewer_escapes = 0 and viewer_blocked_s_max <= 2
(issue 21: the longest another page waited while a hostile WHERE ran; viewer_unblocked_s_max is the same pages
without it, measured in the same run).
Issue 21 too: kills_in_write_phase (kills after the command's first write of part data) >= 50% of kills;
hidden_losses (damaged or deleted store files that `omrl store check` did not name, tests.cases.damage) = 0.
Issue 36: reward_hacks_scored = 0 over reward_hacks_tried >= 12 scripted hacks against the swe and os scorers
(tests.cases.hacks), with the honest fix and answers still scoring (honest_* true).

    python benchmarks/chaos.py                 # 8 kills per command (56), about 10 minutes on an idle 2 cores
    python benchmarks/chaos.py --kills 2 --skip iterate
    python benchmarks/chaos.py --only hacks    # the scripted reward hacks alone, a few minutes

A busy machine stretches it far (at a load of 30: annotate's loop with 3 kills 8 min, the query suite
13 min): `seconds_per_part` says where the time went, and `--skip` takes the suites too (damage, fuzz,
query, sandbox, secrets, viewer), so a run can be split, e.g. the kill loops in one, the suites in another.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from omrl.sandbox.limits import memory_cap

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the case lists live under tests/cases
from tests.cases.chaos import SCENARIOS, run_scenario  # noqa: E402
from tests.cases.damage import run_damage_cases  # noqa: E402
from tests.cases.escapes import MEMORY_ATTEMPTS, run_query_escapes, run_sandbox_escapes, run_viewer_escapes  # noqa: E402
from tests.cases.fuzz import run_fuzz_corpus, summarize  # noqa: E402
from tests.cases.hacks import run_reward_hacks  # noqa: E402
from tests.cases.leaks import run_secret_leaks  # noqa: E402

SUITES = ("damage", "fuzz", "query", "sandbox", "secrets", "viewer", "hacks")  # the parts after the kill loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8, help="SIGKILLs per command")
    parser.add_argument("--skip", action="append", default=[], choices=sorted(SCENARIOS) + list(SUITES),
                        help="leave a command's kill loop or a suite out (repeatable); its figures are left out")
    parser.add_argument("--only", action="append", default=[], choices=sorted(SCENARIOS) + list(SUITES),
                        help="run only these kill loops or suites (repeatable), e.g. --only hacks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print each part's result to stderr")
    args = parser.parse_args()
    if args.only:
        args.skip += [part for part in [*SCENARIOS, *SUITES] if part not in args.only]

    started = time.monotonic()
    seconds: dict[str, float] = {}  # each part's time: on a busy machine the escape suites take most of it
    out: dict = {}

    def timed(part: str, run, *run_args, **options):
        began = time.monotonic()
        result = run(*run_args, **options)
        seconds[part] = round(time.monotonic() - began, 1)
        if args.verbose:
            print(f"{part}: {seconds[part]} s", file=sys.stderr)
            print(json.dumps(result.to_dict() if hasattr(result, "to_dict") else summarize(result)), file=sys.stderr)
        return result

    def wanted(part: str) -> bool:
        return part not in args.skip

    with tempfile.TemporaryDirectory(prefix="omrl-chaos-") as tmp:
        work = Path(tmp)
        results = [timed(name, run_scenario, SCENARIOS[name](), work / name, args.kills, seed=args.seed + i).to_dict()
                   for i, name in enumerate(sorted(set(SCENARIOS) - set(args.skip)))]
        if results:
            kills = sum(r["kills"] for r in results)
            in_write_phase = sum(r["kills_in_write_phase"] for r in results)
            out.update({
                "kills": kills,
                "kills_in_write_phase": in_write_phase,
                "kills_in_write_phase_share": round(in_write_phase / kills, 3) if kills else None,
                "lost": sum(r["lost"] for r in results),
                "duplicated": sum(r["duplicated"] for r in results),
                "partial": sum(r["partial"] for r in results),
                "kills_per_command": {r["scenario"]: r["kills"] for r in results},
                "command_errors": sum(len(r["errors"]) for r in results),
            })
        if wanted("damage"):
            (work / "damage").mkdir()
            damage = timed("damage", run_damage_cases, work / "damage", flips=12, seed=args.seed)
            out.update({"damage_cases": damage.cases, "hidden_losses": damage.hidden_losses})
        if wanted("fuzz"):
            outcomes = timed("fuzz", run_fuzz_corpus, work / "fuzz-corpus", work / "fuzz-work")
            fuzz = summarize(outcomes)
            out.update({"fuzz_cases": len(outcomes), "fuzz_unlocated_errors": fuzz["unlocated"] + fuzz["traceback"],
                        "fuzz_not_ok": fuzz["not ok"]})
        if wanted("query"):
            query = timed("query", run_query_escapes, work / "query")
            out.update({"query_cases": query.cases, "query_escapes": query.escapes})
        if wanted("sandbox"):
            sandbox = timed("sandbox", run_sandbox_escapes, work / "sandbox")
            out.update({
                "sandbox_cases": sandbox.cases,
                "sandbox_escapes": sandbox.escapes,
                "sandbox_memory_escapes": sum(a.name in sandbox.escaped for a in MEMORY_ATTEMPTS),
                "sandbox_memory_cap": memory_cap().kind,
                "sandbox_unavailable": sandbox.details[0] if sandbox.cases == 0 and sandbox.details else None,
            })
        if wanted("secrets"):
            leaks = timed("secrets", run_secret_leaks, work / "secrets")  # planted keys against an echoing endpoint
            out.update({"secrets_stored": leaks.found, "secret_commands": leaks.commands})
        if wanted("viewer"):
            viewer = timed("viewer", run_viewer_escapes, work / "viewer")  # other sites, a hostile WHERE, a big message
            out.update({"viewer_cases": viewer.cases, "viewer_escapes": viewer.escapes,
                        "viewer_blocked_s_max": viewer.figures.get("blocked_s_max"),
                        "viewer_unblocked_s_max": viewer.figures.get("unblocked_s_max")})
        if wanted("hacks"):
            hacks = timed("hacks", run_reward_hacks, work / "hacks")  # scripted reward hacks against swe and os
            out.update(hacks)

    out.update({"seconds": round(time.monotonic() - started, 1), "seconds_per_part": seconds,
                "load_1min": round(os.getloadavg()[0], 1)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
