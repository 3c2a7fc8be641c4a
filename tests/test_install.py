"""omrl as a user installs it: a wheel (not editable) in a fresh virtual environment, run outside the checkout.

Also the package layout: the shipped data is found both here and installed (import cycles:
test_import_cycles.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from omrl.shipped import resolve_tasks, shipped_datasets_dir, shipped_task_sets
from tests.readme_helpers import readme_bash_lines

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "omrl"


def _run(args: list[str], cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment holding omrl from a wheel; its dependencies come from this environment
    (a .pth file naming our site-packages: no network, no CUDA torch), but not our editable omrl."""
    pytest.importorskip("setuptools", minversion="77")
    base = tmp_path_factory.mktemp("install")
    src = base / "src"  # build from a copy: the checkout gets no build/ or egg-info
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, src / "omrl", symlinks=True, ignore=ignore)
    shutil.copytree(ROOT / "datasets", src / "datasets", ignore=ignore)
    shutil.copytree(ROOT / "recipes", src / "recipes", ignore=ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(base / "dist"),
          str(src)], base, timeout=300)
    wheel = next((base / "dist").glob("omrl-*.whl"))
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], base,
         timeout=300)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base)
                .stdout.strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_omrl_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))  # paths only: their .pth files
    return venv                                                                   # (the editable omrl) stay unread


@pytest.mark.slow
def test_the_wheel_runs_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    python, omrl = installed / "bin" / "python", installed / "bin" / "omrl"
    where = _run([str(python), "-c", "import omrl, omrl.shipped; print(omrl.__file__); "
                  "print(omrl.shipped.shipped_datasets_dir())"], work).stdout.split()
    assert all(Path(p).is_relative_to(installed) for p in where), where  # the wheel's omrl, its own data
    assert Path(where[1], "tasks", "math_arith.jsonl").is_file() and Path(where[1], "code_tasks").is_dir()

    _run([str(omrl), "tasks", "generate", "math", "--n", "4", "--out", "tasks.jsonl"], work)
    out = _run([str(omrl), "collect", "--env", "math", "--tasks", "tasks.jsonl", "--policy", "scripted",
                "--store", "store"], work).stdout
    assert "4 written to store" in out and "success 100.0%" in out, out

    # The shipped code-repair tasks name their projects; the installed package finds them.
    shipped_code = Path(where[1], "tasks", "code.jsonl")
    sandbox = [] if shutil.which("bwrap") else ["--unsafe-no-sandbox"]
    out = _run([str(omrl), "collect", "--env", "code", "--tasks", str(shipped_code), "--policy", "scripted",
                "--store", "code-store", "--limit", "2", *sandbox], work).stdout
    assert "2 written to code-store" in out and "success 100.0%" in out, out
    tasks = _run([str(python), "-c", "from omrl.tasks import load_tasks; from omrl.envs.code.projects import project_files; "
                  "tasks = load_tasks('shipped:code'); print(len(tasks), all(project_files(t) for t in tasks))"],
                 work).stdout.split()
    assert tasks == ["13", "True"]

    assert "Usage: omrl demo" in _run([str(omrl), "demo", "--help"], work).stdout
    # The demo's recipe and the data it names come with the wheel: it loads from an empty folder.
    assert "quickstart" in _run([str(omrl), "recipes", "list"], work).stdout
    _run([str(omrl), "recipes", "copy", "quickstart"], work)
    assert (work / "quickstart.yaml").read_bytes() == (ROOT / "recipes" / "quickstart.yaml").read_bytes()
    counts = _run([str(python), "-c", "from omrl.config import load_recipe; from omrl.tasks import load_tasks; "
                   "from omrl.train.config.iterate import IterateRecipe; r = load_recipe('shipped:quickstart', IterateRecipe); "
                   "print(len(load_tasks(r.train_tasks)), len(load_tasks(r.eval_tasks)))"], work).stdout.split()
    assert counts == ["1000", "200"], counts
    assert list(work.iterdir()) and not (work / "datasets").exists()


def readme_quickstart() -> list[str]:
    """The command lines of README.md's "## Quickstart" bash block, in order (blank lines left out)."""
    return readme_bash_lines("Quickstart")


@pytest.mark.slow
def test_the_readme_quickstart_runs_from_the_wheel(installed, tmp_path, monkeypatch):
    """Each line of README's Quickstart block, verbatim, in an empty folder with the wheel's omrl first on PATH."""
    lines = readme_quickstart()
    assert 5 <= len(lines) <= 12 and all(line.startswith("omrl ") for line in lines), lines
    work = tmp_path / "empty"
    work.mkdir()
    monkeypatch.setenv("PATH", f"{installed / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")  # _run passes it on
    assert _run(["bash", "-c", "command -v omrl"], work).stdout.strip() == str(installed / "bin" / "omrl")
    for line in lines:
        _run(["bash", "-c", line], work, timeout=900)
    assert (work / "sft" / "config.json").is_file() and list((work / "sft").glob("*.safetensors")), "no checkpoint"
    assert (work / "report" / "report.md").stat().st_size and (work / "report" / "report.html").is_file()
    assert not (work / "datasets").exists() and not (work / "recipes").exists()  # shipped data came from the wheel


def test_shipped_data_is_found_in_the_checkout():
    assert shipped_datasets_dir().resolve() == (ROOT / "datasets").resolve()
    assert {"code", "grid_eval", "grid_train", "math_arith", "shop"} <= set(shipped_task_sets())
    assert resolve_tasks("shipped:math_arith") == shipped_datasets_dir() / "tasks" / "math_arith.jsonl"
    assert resolve_tasks("gsm8k:main") == "gsm8k:main"
    with pytest.raises(FileNotFoundError, match="shipped:math_arith"):
        resolve_tasks("shipped:nope")
