"""omrl.serve.vllm's command line: the dtype follows the CPU (bf16 only where it is computed natively), whole
prompts only, and the stats that feed vLLM's /metrics (the adaptive limit's queue signal) stay on."""

from __future__ import annotations

from pathlib import Path

import pytest

from omrl.serve import vllm


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("flags", "has_bf16"), [("fpu sse avx2 avx512f", False),
                                                 ("fpu avx512f avx512_bf16", True), ("amx_bf16 amx_tile", True)])
def test_the_served_dtype_follows_the_cpu(model_dir, monkeypatch, flags, has_bf16):
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: f"flags\t\t: {flags}\n"
                        if str(self) == "/proc/cpuinfo" else real_read(self, *a, **k))
    assert vllm.cpu_has_bf16() is has_bf16
    argv = vllm.VLLMServer(model_dir, "m").argv(Path("python"))
    assert _flag(argv, "--dtype") == ("bfloat16" if has_bf16 else "float32")
    assert _flag(vllm.VLLMServer(model_dir, "m", dtype="float16").argv(Path("python")), "--dtype") == "float16"


def test_the_command_line_keeps_stats_on_and_prompts_whole(model_dir):
    argv = vllm.VLLMServer(model_dir, "m", max_num_seqs=4).argv(Path("python"))
    assert "--disable-log-stats" not in argv  # /metrics' num_requests_waiting needs them
    assert "--no-enable-chunked-prefill" in argv and _flag(argv, "--max-num-seqs") == "4"
    assert _flag(argv, "--host") == "127.0.0.1"
