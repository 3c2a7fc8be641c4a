"""Real package sources for SWE tasks: sdists fetched through pip (cached), unpacked, a per-package test
environment (wheels only, installed outside the sandbox), and test runs inside the sandbox with per-test timeouts.

Cache layout (under OMRL_CACHE_DIR, default ~/.cache/omrl): swe/sdists/ (what pip downloaded), swe/src/NAME-VERSION/
(the unpacked tree, never modified), swe/envs/NAME-VERSION/ (pytest, pytest-timeout and the package's declared
and test dependencies, `pip install --target`, wheels only: no package code runs while installing). Fetching an
sdist is `pip download`, which prepares its metadata with the package's build backend, as any pip does.
Tests always run in omrl.sandbox: a copy of the tree at /tmp/project, the environment read-only at ENV_INSIDE.
"""

from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omrl import sandbox
from omrl.errors import UsageError

ENV_INSIDE = "/opt/omrl-env"      # where the package's test environment is shown inside the sandbox
TEST_TOOLS = ("pytest>=7", "pytest-timeout>=2")
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL) (\S+)", re.MULTILINE)
_TEST_EXTRAS = ("test", "tests", "testing", "dev")


def cache_dir() -> Path:
    """omrl's cache folder for SWE sources and environments (OMRL_CACHE_DIR, default ~/.cache/omrl)."""
    return Path(os.environ.get("OMRL_CACHE_DIR") or Path.home() / ".cache" / "omrl") / "swe"


@dataclass
class Package:
    """One unpacked release: its name, version, source tree (read-only by convention), test environment."""

    name: str
    version: str
    source: Path
    env: Path
    sdist_sha256: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


def parse_spec(spec: str) -> tuple[str, str]:
    """NAME==VERSION -> (name, version); a path to a local .tar.gz sdist -> ("", path)."""
    if spec.endswith((".tar.gz", ".tgz")) and Path(spec).is_file():
        return "", spec
    name, sep, version = spec.partition("==")
    if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or not re.fullmatch(r"[0-9A-Za-z.+!_-]+",
                                                                                              version):
        raise UsageError(f"package {spec!r}: give NAME==VERSION (e.g. more-itertools==10.2.0) or a local sdist "
                         "(.tar.gz)")
    return name, version


def fetch(spec: str, progress=print, env: bool = True) -> Package:
    """The package of NAME==VERSION (or a local sdist): downloaded once, unpacked once, its environment built once
    (env=False: not built, for a release whose source is only read, as an earlier release's is)."""
    name, version = parse_spec(spec)
    archive = Path(version) if not name else _download(name, version, progress)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    top = _top_folder(archive)
    source = cache_dir() / "src" / f"{top}-{digest[:12]}"
    if not source.is_dir():
        _unpack(archive, source)
    info = _metadata(source)
    name = name or info.get("Name") or top.rsplit("-", 1)[0]
    version = info.get("Version") or top.rsplit("-", 1)[-1]
    package = Package(name, version, source, cache_dir() / "envs" / f"{top}-{digest[:12]}", digest)
    if env and not (package.env / ".omrl-complete").exists():
        progress(f"{package.key}: installing its test environment (wheels only)")
        _build_env(package, info)
    return package


def from_checkout(folder: str | Path, name: str, version: str, commit: str, progress=print) -> Package:
    """A repository checked out at `commit` (a SWE-bench instance's base_commit) as a package: its files copied
    once into the cache (without .git), its test environment built once from the requirements files it ships
    (pytest tools alone when it ships none). A .git whose HEAD is another commit is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"source {folder}: no such folder (a checkout of {name} at {commit[:12]})")
    head = checkout_head(folder)
    if head is not None and head != commit:
        raise UsageError(f"source {folder}: checked out at {head[:12]}, not at the instance's base_commit {commit[:12]}")
    key = f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{commit[:12]}"
    source = cache_dir() / "src" / key
    if not source.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".src-", dir=_mkdir(source.parent)))
        try:
            shutil.copytree(folder, staging / "tree", symlinks=True, ignore=shutil.ignore_patterns(".git"))
            os.replace(staging / "tree", source)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    wanted = test_requirements(source, {})
    env = cache_dir() / "envs" / f"reqs-{hashlib.sha256(' '.join(sorted(wanted)).encode()).hexdigest()[:12]}"
    if not (env / ".omrl-complete").exists():
        progress(f"{name}@{commit[:12]}: installing its test environment (wheels only)")
        install_folder(env, wanted, fallback=list(TEST_TOOLS))
    return Package(name, version, source, env)


def checkout_head(folder: Path) -> str | None:
    """The commit a checkout's .git/HEAD names (read from its files: running git on a foreign .git could run
    its hooks or config's commands), or None without a .git folder."""
    git = folder / ".git"
    if not (git / "HEAD").is_file():
        return None
    head = (git / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    if not head.startswith("ref: "):
        return head
    ref = head[5:].strip()
    if (git / ref).is_file():
        return (git / ref).read_text(encoding="utf-8", errors="replace").strip()
    packed = git / "packed-refs"
    for line in packed.read_text(encoding="utf-8", errors="replace").splitlines() if packed.is_file() else []:
        if line.endswith(" " + ref):
            return line.split(" ", 1)[0]
    return None


def _download(name: str, version: str, progress) -> Path:
    folder = cache_dir() / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[-_.]+", "[-_.]", name)
    found = [p for p in folder.iterdir() if re.fullmatch(f"(?i){stem}-{re.escape(version)}\\.(tar\\.gz|zip)", p.name)]
    if found:
        return found[0]
    progress(f"{name}=={version}: pip download (sdist)")
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                             "-d", str(folder), f"{name}=={version}"], capture_output=True, text=True, timeout=900)
    found = [p for p in folder.iterdir() if re.fullmatch(f"(?i){stem}-{re.escape(version)}\\.(tar\\.gz|zip)", p.name)]
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise UsageError(f"cannot download the sdist of {name}=={version}: {' / '.join(tail) or 'no file'}")
    return found[0]


def _top_folder(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        names = {member.name.split("/")[0] for member in tar.getmembers()}
    if len(names) != 1:
        raise UsageError(f"{archive.name}: an sdist has one top folder, this one has {len(names)}")
    return names.pop()


def _unpack(archive: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        (top,) = list(staging.iterdir())
        os.replace(top, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _metadata(source: Path) -> dict[str, str | list[str]]:
    """PKG-INFO's fields (Requires-Dist and Provides-Extra as lists)."""
    path = source / "PKG-INFO"
    if not path.is_file():
        return {}
    message = email.parser.Parser().parsestr(path.read_text(encoding="utf-8", errors="replace"))
    info: dict[str, str | list[str]] = {k: v for k, v in message.items()}
    info["Requires-Dist"] = message.get_all("Requires-Dist") or []
    info["Provides-Extra"] = message.get_all("Provides-Extra") or []
    return info


def test_requirements(source: Path, info: dict) -> list[str]:
    """What the tests need: pytest tools, the package's dependencies for no extra or a test extra, and the
    lines of a tests requirements file when the sdist ships one."""
    wanted = list(TEST_TOOLS)
    for requirement in info.get("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra is None and "python_version" not in marker and "sys_platform" not in marker or extra is not None and extra.group(1) in _TEST_EXTRAS and "python_version" not in marker:
            wanted.append(spec.strip())
    for name in ("requirements-test.txt", "test-requirements.txt", "requirements/test.txt", "tests/requirements.txt"):
        path = source / name
        if path.is_file():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                line = line.split("#")[0].strip()
                if line and not line.startswith(("-", ".")) and "://" not in line:
                    wanted.append(line)
    return list(dict.fromkeys(wanted))


def _build_env(package: Package, info: dict) -> None:
    wanted = test_requirements(package.source, info)
    own = re.sub(r"[-_.]+", "-", package.name).lower()
    wanted = [w for w in wanted if re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[ ;]", w)[0]).lower() != own]
    try:  # an optional test dependency without a wheel: the tools alone
        install_folder(package.env, wanted, fallback=list(TEST_TOOLS))
    except UsageError as exc:
        raise UsageError(f"{package.key}: cannot install pytest into its test environment: {exc}") from None


def install_folder(folder: Path, requirements: list[str], fallback: list[str] | None = None) -> Path:
    """`pip install --target` of wheels only into `folder`, once: built aside, marked complete, then moved in
    place, so a crash leaves no half folder; `fallback` is installed instead when `requirements` cannot be."""
    if (folder / ".omrl-complete").exists():
        return folder
    staging = Path(tempfile.mkdtemp(prefix=".env-", dir=_mkdir(folder.parent)))
    try:
        for attempt in [requirements] + ([fallback] if fallback else []):
            result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--only-binary", ":all:",
                                     "--target", str(staging), *attempt], capture_output=True, text=True,
                                    timeout=900)
            if result.returncode == 0:
                break
        else:
            raise UsageError(f"pip install {' '.join(attempt)} failed: "
                             f"{' / '.join(result.stderr.strip().splitlines()[-2:])}")
        (staging / ".omrl-complete").write_text(" ".join(attempt) + "\n")
        staging.chmod(0o755)  # mkdtemp's 0700 would keep the sandbox's user out
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------------ test runs


@dataclass
class TestRun:
    """One pytest run in the sandbox: the outcome of each test (node id -> PASSED/FAILED/ERROR/...), timing."""

    outcomes: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    per_test_timeouts: int = 0
    seconds: float = 0.0
    output: str = ""

    def passed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome in ("PASSED", "XFAIL")}


def pytest_command(tests: list[str] | None = None, per_test_timeout_s: float = 10.0) -> list[str]:
    """pytest as the sandbox runs it: the package's own addopts ignored (they may name plugins not installed),
    one line per test outcome, a per-test time limit (pytest-timeout, signal method)."""
    return ["python3", "-m", "pytest", "-q", "-rA", "--tb=line", "--no-header", "-p", "no:cacheprovider",
            "-o", "addopts=", "-p", "pytest_timeout", f"--timeout={per_test_timeout_s:g}",
            "--timeout-method=signal", "--color=no", *(tests or [])]


def run_tests(package: Package, tree: Path, tests: list[str] | None = None, per_test_timeout_s: float = 10.0,
              timeout_s: float = 300.0, patches: list[str] = (), memory_mb: int = 2048) -> TestRun:
    """Run the package's tests (or the node ids or files `tests`) on `tree` inside the sandbox; `patches` are
    first applied in order with `git apply`, inside the sandbox too (one that does not apply fails the run)."""
    command = pytest_command(tests, per_test_timeout_s)
    with tempfile.TemporaryDirectory(prefix="omrl-swe-run-") as work:
        project = Path(work) / "project"
        shutil.copytree(tree, project, symlinks=True)
        names = []
        for i, patch in enumerate(patches):
            names.append(f".omrl-{i}.patch")
            (project / names[-1]).write_text(patch, encoding="utf-8")
        if names:
            script = ('for p in "$@"; do case "$p" in .omrl-*.patch) git apply --whitespace=nowarn "$p" || '
                      "{ echo 'OMRL: the patch does not apply'; exit 97; }; rm -f \"$p\"; shift;; *) break;; esac; "
                      'done; exec "$@"')
            command = ["/bin/sh", "-c", script, "sh", *names, *command]
        result = sandbox.run_sandboxed(
            command, project, sandbox.SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=128,
                                                    disk_mb=512, max_output_bytes=8 << 20),
            env={"PYTHONPATH": f"{ENV_INSIDE}:{sandbox.PROJECT_DIR}/src:{sandbox.PROJECT_DIR}", "PYTHONHASHSEED": "0",
                 "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # only the plugin named: pytest_timeout
            view=sandbox.SandboxView(binds=((str(package.env), ENV_INSIDE),)))
    outcomes = {test: outcome for outcome, test in _RESULT.findall(result.output)}
    timeouts = len(re.findall(r"Timeout \(?>", result.output))  # pytest-timeout: "Failed: Timeout (>2.0s) ..."
    return TestRun(outcomes, result.returncode, result.timed_out, timeouts,
                   round(result.elapsed_s, 3), result.output)
