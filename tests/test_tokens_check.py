"""`omrl store check --tokens MODEL`: re-tokenising stored messages reproduces the sampled completion ids,
and a planted drift is found and located (tiny offline model, episodes collected with the hf policy)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from omrl.cli.main import cli  # noqa: E402
from omrl.envs.grid import GridEnv, grid_tasks  # noqa: E402
from omrl.formats.exporters import export_store  # noqa: E402
from omrl.formats.importer import load_trajectories  # noqa: E402
from omrl.policies.hf import HFPolicy  # noqa: E402
from omrl.policies.tokens_check import check_store_tokens, check_tokens, load_tokenizer  # noqa: E402
from omrl.rollout import collect  # noqa: E402
from omrl.schema import Message, ToolCall, Trajectory, Turn  # noqa: E402
from omrl.schema.messages import to_chat_template  # noqa: E402
from omrl.store import Store  # noqa: E402
from tests.train_helpers import TOOLS, random_mover_model  # noqa: E402


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """(model path, store) with 4 grid episodes of up to 3 turns played by the hf policy (completion ids kept)."""
    root = tmp_path_factory.mktemp("tokens")
    model = random_mover_model(root / "mover")
    store = Store.create(root / "store")
    policy = HFPolicy(str(model), max_new_tokens=4)
    asyncio.run(collect(lambda: GridEnv(), grid_tasks(4, seed=0, split="eval"), policy, store, max_turns=3, seed=1))
    return str(model), store


def planted(store: Store, tmp_path, edit) -> tuple[Store, dict]:
    """A copy of the store's rows with `edit(rows)` applied (returns what it changed, for the asserts)."""
    rows = store.read().to_pylist()
    changed = edit(rows)
    copy = Store.create(tmp_path / "drifted")
    copy.append(rows)
    return copy, changed


def test_the_untouched_store_reproduces_every_turn(collected):
    model, store = collected
    report = check_store_tokens(store, model)
    assert report.trajectories == 4 and report.turns == sum(r["num_turns"] for r in store.read().to_pylist())
    assert report.turns > 4 and report.ok, [d.describe() for d in report.drifts]


def test_an_edited_reply_is_found_at_its_turn_and_position(collected, tmp_path):
    model, store = collected

    def edit(rows):
        row = next(r for r in rows if r["num_turns"] >= 2)
        at = [i for i, m in enumerate(row["messages"]) if m["role"] == "assistant"][1]
        before = row["messages"][at]["content"]
        row["messages"][at]["content"] = "wall" if before != "wall" else "goal"
        return {"id": row["id"], "at": at, "before": before}

    copy, changed = planted(store, tmp_path, edit)
    report = check_store_tokens(copy, model)
    assert len(report.drifts) == 1
    drift = report.drifts[0]
    assert (drift.trajectory_id, drift.turn, drift.message, drift.kind, drift.position) == (
        changed["id"], 1, changed["at"], "completion", 0)
    assert drift.stored_text.startswith(changed["before"])  # what the model sampled
    assert drift.retokenised_text.startswith("wall" if changed["before"] != "wall" else "goal")
    assert drift.context.endswith("<|im_start|>assistant\n")  # the decoded text right before it

    result = CliRunner().invoke(cli, ["store", "check", str(copy.path), "--tokens", model])
    assert result.exit_code == 1, result.output
    assert "1 drift" in result.output and f"{changed['id']} turn 1 (message {changed['at']})" in result.output
    assert "completion token 0 differs" in result.output


def test_an_edited_observation_shows_as_a_prompt_drift(collected, tmp_path):
    model, store = collected

    def edit(rows):
        row = next(r for r in rows if r["num_turns"] >= 2)
        at = next(i for i, m in enumerate(row["messages"]) if m["role"] == "user" and i > 2)  # after the first reply
        row["messages"][at]["content"] += " and the wall is near"
        return {"id": row["id"]}

    copy, changed = planted(store, tmp_path, edit)
    report = check_store_tokens(copy, model)
    assert report.drifts and {d.trajectory_id for d in report.drifts} == {changed["id"]}
    assert {d.kind for d in report.drifts} == {"prompt"} and report.drifts[0].turn == 1


def test_cli_passes_on_the_untouched_store_and_names_a_missing_model(collected, tmp_path):
    model, store = collected
    result = CliRunner().invoke(cli, ["store", "check", str(store.path), "--tokens", model])
    assert result.exit_code == 0, result.output
    assert "no drift" in result.output and "4 trajectories" in result.output
    result = CliRunner().invoke(cli, ["store", "check", str(store.path), "--tokens", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "cannot load the tokenizer" in result.output


def test_token_ids_survive_an_atif_export_and_import(collected, tmp_path):
    """ATIF carries completion ids in step metrics: the imported copy still checks clean."""
    model, store = collected
    export_store(store, tmp_path / "t.jsonl", "atif")
    copy = Store.create(tmp_path / "imported")
    copy.append(load_trajectories(tmp_path / "t.jsonl", "atif"))
    report = check_store_tokens(copy, model)
    assert report.trajectories == 4 and report.ok, [d.describe() for d in report.drifts]


def test_a_tool_call_written_with_other_spacing_is_a_drift(collected):
    """The model wrote `{"direction":"left"}`; the template re-serialises it as `{"direction": "left"}`."""
    model, _ = collected
    tokenizer = load_tokenizer(model)
    call = ToolCall("move", '{"direction":"left"}', "c1")
    messages = [Message("system", "Reach the goal."), Message("user", "at 1 3 goal 3 3"),
                Message("assistant", "", tool_calls=[call])]
    row = Trajectory(id="call", task_id="call", messages=messages, tools=TOOLS,
                     turns=[Turn(0, done=True)]).to_row()
    chat = to_chat_template(row["messages"])
    prompt = tokenizer.apply_chat_template(chat[:2], tools=json.loads(TOOLS), tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(chat, tools=json.loads(TOOLS), tokenize=False)
    reply = full[len(prompt):full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")]
    assert '"arguments": {"direction": "left"}' in reply

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    row["turns"][0]["completion_ids"] = ids(reply)  # what the template writes: no drift
    assert check_tokens([row], model, tokenizer).ok
    sampled = reply.replace('{"direction": "left"}', '{"direction":"left"}')
    row["turns"][0]["completion_ids"] = ids(sampled)  # what the model wrote: a drift at the arguments
    report = check_tokens([row], model, tokenizer)
    assert len(report.drifts) == 1
    drift = report.drifts[0]
    assert (drift.turn, drift.message, drift.kind) == (0, 2, "completion")
    assert drift.context.endswith('"arguments": {"direction":')  # decoded up to the first differing token
    assert drift.stored_text.startswith('"left"') and drift.retokenised_text.startswith(' "left"')
    assert tokenizer.decode(ids(sampled)[:drift.position]) == sampled.split('"left"')[0]


def test_rows_without_completion_ids_are_counted_not_checked(tmp_path, collected):
    model, _ = collected
    row = Trajectory(id="plain", task_id="p", messages=[Message("user", "hi"), Message("assistant", "left")],
                     turns=[Turn(0, done=True)]).to_row()
    report = check_tokens([row], model)
    assert (report.trajectories, report.turns, report.without_ids, report.ok) == (0, 0, 1, True)
