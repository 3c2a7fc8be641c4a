"""The row types: a trajectory, annotation, message, tool call and turn as omrl passes them, one key per column.

These are TypedDicts (plain dicts at run time) whose keys and value types mirror the Arrow schemas in
omrl.schema.tables field by field; tests/test_schema_rows.py fails when the two differ. A column Arrow
allows to be null is `X | None` here. JSON-text columns (task, tools, metadata, info) are `str`: read them
with omrl.schema.payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict

# A record on its way in (a file's line, a row built in code): any keys and values until a normaliser
# (omrl.schema.normalise) checks it and returns a TrajectoryRow or AnnotationRow. A row is one too.
UncheckedRow = Mapping[str, Any]


class ToolCallRow(TypedDict):
    """One tool call of an assistant message (TOOL_CALL_TYPE)."""

    id: str | None
    name: str | None
    arguments: str | None  # JSON text, exactly as the model wrote it


class MessageRow(TypedDict):
    """One chat message (MESSAGE_TYPE); trainable null: decided by role."""

    role: str | None
    content: str | None
    reasoning: str | None
    tool_calls: list[ToolCallRow] | None
    tool_call_id: str | None
    name: str | None
    trainable: bool | None


class TurnRow(TypedDict):
    """One step of an episode (TURN_TYPE): its reward, timing, tokens and the completion's ids and logprobs."""

    index: int | None
    reward: float | None
    done: bool | None
    latency_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    info: str | None  # JSON text of an object
    completion_ids: list[int] | None
    logprobs: list[float] | None


class TrajectoryRow(TypedDict):
    """One attempt by one policy at one task (TRAJECTORY_SCHEMA)."""

    id: str
    run_id: str | None
    round: int | None
    task_id: str | None
    group_id: str | None
    sample: int | None
    env: str | None
    model: str | None
    instruction: str | None
    task: str | None  # JSON text of an object, gold answers included
    tools: str | None  # JSON text of a list of OpenAI function schemas
    messages: list[MessageRow] | None
    turns: list[TurnRow] | None
    reward: float | None
    success: bool | None
    status: str | None
    error: str | None
    num_turns: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    duration_s: float | None
    source: str | None
    parent_id: str | None
    metadata: str | None  # JSON text of an object
    created_at: datetime | None


class AnnotationRow(TypedDict):
    """One judgement of one trajectory by one annotator (ANNOTATION_SCHEMA)."""

    id: str
    trajectory_id: str
    annotator: str
    kind: str | None
    score: float | None
    label: str | None
    rationale: str | None
    status: str | None
    error: str | None
    judge_model: str | None
    rubric: str | None
    prompt_hash: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost_usd: float | None
    run_id: str | None
    metadata: str | None  # JSON text of an object
    created_at: datetime | None
