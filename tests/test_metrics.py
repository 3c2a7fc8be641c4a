"""Automatic metrics on hand-made trajectories with known answers, written to a real store."""

from __future__ import annotations

import json

import pytest

from omrl.annotate import metrics as M
from omrl.annotate.inputs import final_answer, metric_inputs
from omrl.annotate.reward import combined_reward, components_sql, load_reward_recipe
from omrl.annotate.runner import annotate
from omrl.schema import Message, ToolCall, Trajectory, Turn
from omrl.store import Store


def traj(tid: str, answer_call: str | None = "42", gold: object = "42", reward: float | None = 1.0,
         success: bool | None = True, status: str = "ok", extra: list[Message] | None = None, **kw) -> dict:
    msgs = [Message("system", "Use the tools."), Message("user", "What is 6*7?")]
    msgs += extra or []
    if answer_call is not None:
        msgs.append(Message("assistant", None, tool_calls=[ToolCall("answer", json.dumps({"answer": answer_call}), "c9")]))
    task = {"id": "t", "instruction": "What is 6*7?"} | ({"answer": gold} if gold is not None else {})
    return Trajectory(id=tid, task_id=kw.pop("task_id", "t"), messages=msgs, instruction="What is 6*7?",
                      task=json.dumps(task), reward=reward, success=success, status=status, **kw).to_row()


def inputs(row: dict) -> dict:
    return metric_inputs(row)


def run(name: str, row: dict):
    return M.call_metric(M.METRICS.load(name), inputs(row))


def test_final_answer_prefers_answer_tool_then_text():
    row = traj("a", answer_call="  42 ")
    assert final_answer(row["messages"]) == "  42 "
    text_only = traj("b", answer_call=None, extra=[Message("assistant", "The answer is 41.")])
    assert final_answer(text_only["messages"]) == "The answer is 41."
    assert final_answer([{"role": "user", "content": "hi"}]) is None


def test_match_metrics_known_answers():
    assert run("exact_match", traj("a", "42")) == 1.0
    assert run("exact_match", traj("a", "forty-two")) == 0.0
    assert run("exact_match", traj("a", "42", gold=["41", "42"])) == 1.0
    assert run("normalized_match", traj("a", "The Eiffel Tower!", gold="eiffel tower")) == 1.0
    assert run("normalized_match", traj("a", "Eiffel", gold="eiffel tower")) == 0.0
    assert run("numeric_match", traj("a", "so it is 1,234.0 apples", gold="1234")) == 1.0
    assert run("numeric_match", traj("a", "1235", gold="1234")) == 0.0
    assert run("numeric_match", traj("a", "no number", gold="7")) == 0.0
    # Not applicable: no gold answer, or a gold answer without a number.
    assert run("exact_match", traj("a", "42", gold=None)) is None
    assert run("numeric_match", traj("a", "42", gold="Paris")) is None


def test_structural_metrics():
    good = traj("a", reward=0.5, success=False, prompt_tokens=100, completion_tokens=20)
    assert run("env_reward", good) == 0.5
    assert run("success", good) == 0.0
    assert run("format_valid", good) == 1.0
    assert run("num_turns", good) == 1
    assert run("num_tokens", good) == 120
    assert run("truncated", traj("t", status="truncated")) == 1.0
    assert run("truncated", good) == 0.0
    bad_args = traj("b", extra=[Message("assistant", None, tool_calls=[ToolCall("search", "{not json", "c1")])])
    assert run("format_valid", bad_args) == 0.0
    assert run("format_valid", traj("c", answer_call=None)) == 0.0  # no final answer
    turns_only = traj("d", turns=[Turn(0, prompt_tokens=10, completion_tokens=3), Turn(1, prompt_tokens=12)])
    assert run("num_tokens", turns_only) == 25
    assert run("num_tokens", traj("e")) is None


def test_repetition_and_tool_errors():
    call = Message("assistant", None, tool_calls=[ToolCall("ls", '{"path": "."}', "c1")])
    same = Message("assistant", None, tool_calls=[ToolCall("ls", '{ "path":"." }', "c2")])  # same call, other spacing
    extra = [call, Message("tool", "a.txt", tool_call_id="c1", name="ls"),
             same, Message("tool", "Error: permission denied", tool_call_id="c2", name="ls")]
    row = traj("r", extra=extra)
    # 3 assistant messages (ls, ls again, answer): one repeats -> 1/3
    assert run("repetition", row) == pytest.approx(1 / 3)
    assert run("tool_error_rate", row) == 0.5
    assert run("tool_error_rate", traj("n")) is None  # no tool results: not applicable


def test_call_metric_passes_only_declared_arguments():
    seen = {}

    def mine(answer, num_turns):
        seen.update(answer=answer, num_turns=num_turns)
        return 1

    assert M.call_metric(mine, inputs(traj("a"))) == 1
    assert seen == {"answer": "42", "num_turns": 1}
    with pytest.raises(ValueError, match="unknown argument 'nope'"):
        M.check_signature(lambda nope: 1, "x")


def test_annotate_writes_scores_errors_and_skips(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj("a", "42"), traj("b", "7"), traj("c", "42", gold=None)])
    user = tmp_path / "user_metrics.py"
    user.write_text(
        "def answer_len(final_answer):\n    return len(final_answer or '')\n\n"
        "def broken(trajectory):\n    raise RuntimeError('boom ' + trajectory['id'])\n")
    summary = annotate(store, ["exact_match", "num_turns", f"{user}:answer_len", f"{user}:broken"])
    assert summary.written["exact_match"] == 2 and summary.skipped["exact_match"] == 1
    assert summary.errors["broken"] == 3
    ann = store.sql("SELECT trajectory_id, annotator, score, status, error FROM annotations "
                    "WHERE annotator = 'broken' ORDER BY trajectory_id").to_pylist()
    assert [a["status"] for a in ann] == ["error"] * 3
    assert all(a["score"] is None and "boom" in a["error"] for a in ann)
    scores = {r["trajectory_id"]: r for r in store.sql("SELECT * FROM scores").to_pylist()}
    assert scores["a"]["exact_match"] == 1.0 and scores["b"]["exact_match"] == 0.0
    assert scores["c"]["exact_match"] is None  # skipped, not 0
    assert scores["a"]["answer_len"] == 2.0
    assert "broken" not in scores["a"]  # errors never show up as scores


def test_module_metric_and_unknown_name():
    m = M.load_metric("omrl.annotate.metrics:exact_match")
    assert m.name == "exact_match" and m.fn is M.exact_match
    with pytest.raises(ValueError, match="unknown metric"):
        M.load_metric("no_such_metric")


def test_reannotating_keeps_history_latest_wins(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj("a")])
    store.append([{"trajectory_id": "a", "annotator": "q", "score": 0.1, "created_at": "2024-01-01T00:00:00Z"}],
                 table="annotations")
    store.append([{"trajectory_id": "a", "annotator": "q", "score": 0.9, "created_at": "2024-01-02T00:00:00Z"}],
                 table="annotations")
    assert store.sql("SELECT q FROM scores").column("q").to_pylist() == [0.9]
    assert store.sql("SELECT count(*) AS n FROM annotations WHERE annotator='q'").column("n")[0].as_py() == 2


def test_combined_reward_missing_components_are_null_and_counted(tmp_path):
    store = Store.create(tmp_path / "s")
    store.append([traj("a", "42", reward=1.0), traj("b", "7", reward=0.0), traj("c", "42", gold=None, reward=0.5)])
    annotate(store, ["exact_match"])
    store.append([{"trajectory_id": "a", "annotator": "judge:q", "score": 8.0}], table="annotations")
    recipe = load_reward_recipe({"components": {"env_reward": 1.0, "exact_match": 0.5,
                                         "judge:q": {"weight": 1.0, "scale": [0, 10]}}})
    got = {r["trajectory_id"]: r for r in combined_reward(store, recipe).to_pylist()}
    assert got["a"]["reward"] == pytest.approx(1.0 + 0.5 + 0.8)
    assert got["b"]["reward"] is None and got["b"]["missing"] == "judge:q"
    assert got["c"]["reward"] is None and got["c"]["missing"] == "exact_match,judge:q"
    renorm = load_reward_recipe({"components": {"env_reward": 1.0, "exact_match": 1.0}, "missing": "renormalize"})
    got = {r["trajectory_id"]: r["reward"] for r in combined_reward(store, renorm).to_pylist()}
    assert got == {"a": 2.0, "b": 0.0, "c": pytest.approx(1.0)}  # c: 0.5 scaled by 2/1
    # The recipe written as an annotator shows in `scores`, and its SQL runs through omrl query.
    summary = annotate(store, reward_recipe=recipe)
    assert summary.reward_missing == 2
    assert store.sql('SELECT reward FROM scores WHERE trajectory_id = \'a\'').column("reward")[0].as_py() == \
        pytest.approx(2.3)
    assert store.sql(components_sql(recipe)).num_rows == 3


def test_bad_recipe_is_refused():
    with pytest.raises(ValueError, match="missing"):
        load_reward_recipe({"components": {"env_reward": 1}, "missing": "zero"})
    with pytest.raises(ValueError, match="components.env_reward.weight must be float"):
        load_reward_recipe({"components": {"env_reward": "heavy"}})


def test_shipped_reward_recipes_load():
    from pathlib import Path

    paths = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("reward*.yaml"))
    assert paths
    for path in paths:
        recipe = load_reward_recipe(path)
        assert recipe.components and all(c.weight for c in recipe.components)


def test_numeric_match_on_real_gsm8k_gold_answers():
    from pathlib import Path

    real = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "gsm8k_test.jsonl"
    if not real.is_file():
        pytest.skip("real data folder absent")
    rows = [json.loads(line) for line in real.read_text().splitlines()[:20]]
    for i, r in enumerate(rows):
        gold_number = r["answer"].split("####")[-1].strip().replace(",", "")
        right = Trajectory(id=f"g{i}", task_id=f"g{i}", task=json.dumps({"answer": r["answer"]}), messages=[
            Message("user", r["question"]), Message("assistant", f"So the result is {gold_number}.")]).to_row()
        wrong = Trajectory(id=f"w{i}", task_id=f"g{i}", task=json.dumps({"answer": r["answer"]}), messages=[
            Message("user", r["question"]), Message("assistant", f"So the result is {float(gold_number) + 1}.")]).to_row()
        assert run("numeric_match", right) == 1.0, r["answer"]
        assert run("numeric_match", wrong) == 0.0
