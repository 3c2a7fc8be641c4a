"""Real package sources for SWE tasks: sdists fetched from the package index (cached), unpacked, and a per-package
test environment (wheels only, installed outside the sandbox); test runs are testrun.py's.

Cache layout (under OMRL_CACHE_DIR, default ~/.cache/omrl): swe/sdists/ (the sdist files), swe/src/NAME-VERSION/
(the unpacked tree, never modified), swe/envs/NAME-VERSION/ (pytest, pytest-timeout and the package's declared
and test dependencies, `pip install --target`, wheels only: no package code runs while installing). An sdist is
fetched from pip's configured package index as a file, never built: none of its code runs on this machine.
Tests always run in omrl.sandbox: a copy of the tree at /tmp/project, the environment read-only at ENV_INSIDE.
"""

from __future__ import annotations

import email.parser
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from omrl import shipped
from omrl.errors import UsageError

ENV_INSIDE = "/opt/omrl-env"      # where the package's test environment is shown inside the sandbox
TEST_TOOLS = ("pytest>=7", "pytest-timeout>=2")
_TEST_EXTRAS = ("test", "tests", "testing", "dev")


def cache_dir() -> Path:
    """omrl's cache folder for SWE sources and environments (OMRL_CACHE_DIR, default ~/.cache/omrl)."""
    return shipped.cache_dir() / "swe"


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
    name = _safe_name(name or info.get("Name") or top.rsplit("-", 1)[0])  # the sdist's own words: task ids
    version = _safe_name(info.get("Version") or top.rsplit("-", 1)[-1])
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
    """The sdist file of NAME==VERSION, fetched once from the package index as a file: nothing in it runs on
    this machine (`pip download` would run its build backend to read its metadata)."""
    folder = cache_dir() / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[-_.]+", "[-_.]", name)
    wanted = re.compile(f"(?i){stem}-{re.escape(version)}\\.(tar\\.gz|zip)")
    found = [p for p in folder.iterdir() if wanted.fullmatch(p.name)]
    if found:
        return found[0]
    progress(f"{name}=={version}: downloading its sdist from the package index")
    tried = []
    for index in index_urls():
        try:
            files = _index_files(index, name)
        except (OSError, ValueError) as exc:
            tried.append(f"{index}: {exc}")
            continue
        for filename, url, sha256 in files:
            if wanted.fullmatch(filename) and "/" not in filename and not filename.startswith("."):
                return _fetch_file(url, folder / filename, sha256)
        tried.append(f"{index}: no sdist of {version}")
    raise UsageError(f"cannot download the sdist of {name}=={version}: {' / '.join(tried)[-400:] or 'no index'}")


def index_urls() -> list[str]:
    """pip's configured index and extra indexes (PIP_INDEX_URL, pip config), in pip's order; PyPI by default."""
    result = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60)
    settings = dict(re.findall(r"^(?:global|download|install|:env:)\.([a-z-]+)='(.*)'$", result.stdout, re.M))
    main = os.environ.get("PIP_INDEX_URL") or settings.get("index-url") or "https://pypi.org/simple"
    extra = (os.environ.get("PIP_EXTRA_INDEX_URL") or settings.get("extra-index-url") or "").split()
    return list(dict.fromkeys([main, *extra]))


_JSON_TYPE = "application/vnd.pypi.simple.v1+json"
_LINK = re.compile(r"""<a\s[^>]*href=["']([^"']+)["'][^>]*>([^<]+)</a>""", re.IGNORECASE)


def _index_files(index: str, name: str) -> list[tuple[str, str, str]]:
    """(filename, absolute url, sha256 or "") of a project's files on a simple index (PEP 691 JSON or PEP 503 HTML)."""
    project = re.sub(r"[-_.]+", "-", name).lower()
    page = index.rstrip("/") + f"/{project}/"
    if page.startswith("file:"):  # a folder index, as pip reads one: its index.html, else its files
        folder = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path))
        if not (folder / "index.html").is_file():
            return [(p.name, p.as_uri(), "") for p in sorted(folder.iterdir()) if p.is_file()]
        page, body, kind = (folder / "index.html").as_uri(), (folder / "index.html").read_text("utf-8", "replace"), ""
    else:
        request = urllib.request.Request(page, headers={"Accept": f"{_JSON_TYPE}, text/html;q=0.1"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read(32 << 20).decode("utf-8", "replace")
            kind = response.headers.get("Content-Type", "")
    if _JSON_TYPE in kind or body.lstrip().startswith("{"):
        files = json.loads(body).get("files", [])
        return [(f["filename"], urllib.parse.urljoin(page, f["url"]), (f.get("hashes") or {}).get("sha256", ""))
                for f in files if isinstance(f, dict) and "filename" in f and "url" in f]
    found = []
    for href, text in _LINK.findall(body):
        url, _, fragment = urllib.parse.urljoin(page, html.unescape(href)).partition("#")
        sha256 = fragment[len("sha256="):] if fragment.startswith("sha256=") else ""
        found.append((html.unescape(text).strip(), url, sha256))
    return found


def _fetch_file(url: str, target: Path, sha256: str) -> Path:
    """`url` saved as `target` (written aside, then renamed), checked against the index's sha256 when it gives one."""
    staging = target.with_name(f".{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=300) as response, open(staging, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if sha256 and digest.hexdigest() != sha256.lower():
            raise UsageError(f"{target.name}: its sha256 is not the one the package index gives; not used")
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def _safe_name(text: str) -> str:
    """A name or version from an sdist's metadata as it may go into task ids and paths: [A-Za-z0-9._+-], at most
    100 characters, never empty or dots only."""
    cleaned = re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text))).strip(".-")[:100]
    return cleaned or "unnamed"


def _top_folder(archive: Path) -> str:
    try:
        with tarfile.open(archive) as tar:
            names = {member.name.split("/")[0] for member in tar.getmembers()}
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"{archive.name}: not a readable sdist ({exc})") from None
    if len(names) != 1:
        raise UsageError(f"{archive.name}: an sdist has one top folder, this one has {len(names)}")
    return names.pop()


def _unpack(archive: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(staging, filter="data")  # refuses links and paths that point outside
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise UsageError(f"{archive.name}: cannot unpack it safely ({exc})") from None
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
