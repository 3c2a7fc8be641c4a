from __future__ import annotations

import pytest

from omrl.envs import make_env
from omrl.envs.base import Action, Task
from omrl.envs.expression import ExpressionError, evaluate, numbers_match, parse_number
from omrl.envs.math import generate_tasks
from omrl.envs.toolenv import play_episode
from omrl.tasks import load_tasks, shipped_datasets_dir


@pytest.mark.parametrize("expression, value", [
    ("2 + 3 * 4", 14), ("(1 + 2) ** 3", 27), ("-5 // 2", -3), ("7 % 3", 1), ("10 / 4", 2.5),
    ("1,000 * 2", 2000), ("-(3 - 5)", 2), ("2^10", 1024),
])
def test_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "open('x')", "9 ** 9 ** 9", "10 ** 5000", "1 / 0", "a + 1", "[1, 2]",
    "(1).__class__", "", "2 ** 4096 * 2 ** 4096", "1e309", "-1e999",
])
def test_calculator_refuses_non_arithmetic_and_huge_results(expression):
    with pytest.raises(ExpressionError):
        evaluate(expression)


def test_numeric_answers_are_matched_tolerantly():
    assert parse_number("$1,000") == 1000
    assert numbers_match("5.0", "5") and numbers_match("$5", "5") and numbers_match("1,000", "1000")
    assert numbers_match("The answer is 18 dollars", "18")
    assert not numbers_match("17", "18") and not numbers_match("none", "18")


def test_expert_solves_generated_and_shipped_tasks():
    tasks = generate_tasks(20, seed=5) + load_tasks(shipped_datasets_dir() / "tasks" / "math_arith.jsonl")
    assert len({t.id for t in tasks}) == len(tasks)
    for task in tasks:
        total, last, _ = play_episode(make_env("math"), task)
        assert total == 1.0 and last.done and last.info["success"], task.id


def test_generated_tasks_are_reproducible():
    assert [t.to_row() for t in generate_tasks(5, seed=3)] == [t.to_row() for t in generate_tasks(5, seed=3)]
    assert generate_tasks(5, seed=3)[0].instruction != generate_tasks(5, seed=4)[0].instruction or \
        generate_tasks(5, seed=3)[1].instruction != generate_tasks(5, seed=4)[1].instruction


def test_wrong_answer_gets_zero_and_invalid_actions_are_observations():
    env = make_env("math")
    env.reset(Task(id="t", instruction="What is 2 + 2?", answer="4"))
    for action, needle in [(Action(tool="nope"), "Unknown tool"), (Action(text="I am thinking"), "No tool call"),
                           (Action(tool="calculator", arguments={"expression": "1/0"}), "division by zero"),
                           (Action(tool="calculator", arguments={}), "missing required"),
                           (Action(tool="answer", arguments={"value": "four"}), "must be a number")]:
        result = env.step(action)
        assert result.info["invalid_action"] is True and needle in result.observation and not result.done
    assert env.step(Action(tool="calculator", arguments={"expression": "2+2"})).observation == "4"
    wrong = env.step(Action(tool="answer", arguments={"value": "5"}))
    assert wrong.done and wrong.reward == 0.0 and wrong.info["success"] is False
    assert env.step(Action(tool="answer", arguments={"value": "4"})).info["invalid_action"]  # episode over


def test_prose_final_answer_counts_as_answer():
    env = make_env("math")
    env.reset(Task(id="t", instruction="2+2?", answer="4"))
    result = env.step(Action(text="2 + 2 = 4\n#### 4"))
    assert result.done and result.reward == 1.0


def test_task_without_numeric_answer_is_an_env_error():
    with pytest.raises(ValueError, match="no numeric gold answer"):
        make_env("math").reset(Task(id="t", instruction="?", answer=None))
