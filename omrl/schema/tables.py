"""The Arrow schemas of the trajectory and annotation tables: the one source of truth for every column omrl stores.

One trajectory row is one attempt by one policy at one task. Free-form payloads are JSON strings
(never Arrow maps, which Hugging Face `datasets` cannot load); "none" is an empty list, never null.
"""

from __future__ import annotations

import pyarrow as pa

# The store's version. 2: repeated text dictionary-encoded, flat side data per part (omrl.store.layout); stores of
# version 1 are read as they are. Rows did not change: their JSON Schema keeps ROW_SCHEMA_VERSION.
SCHEMA_VERSION = 2
ROW_SCHEMA_VERSION = 1

STATUSES = ("ok", "truncated", "env_error", "policy_error", "timeout")
# An episode that ran to its end (done, or out of turns): its `success` is an outcome.
FINISHED_STATUSES = ("ok", "truncated")
# Something failed (environment, policy, time limit): never scored, never trained on, never a failure.
FAILED_STATUSES = ("env_error", "policy_error", "timeout")
ROLES = ("system", "user", "assistant", "tool")
ANNOTATION_KINDS = ("score", "label", "rank", "pairwise")
ANNOTATION_STATUSES = ("ok", "error")

# What a string or float column holds beyond its Arrow type, kept on the field ("omrl.kind") so the
# normalisers are derived from the schema: json (JSON text; objects and lists are serialised), raw (text
# kept as written, objects serialised), key (id-like: text, or an integer as its digits), text (text only),
# finite (a finite number or null).
JSON_TEXT = {"omrl.kind": "json"}
RAW_JSON = {"omrl.kind": "raw"}
KEY = {"omrl.kind": "key"}
TEXT = {"omrl.kind": "text"}
FINITE = {"omrl.kind": "finite"}

TOOL_CALL_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("arguments", pa.string(), metadata=RAW_JSON),  # JSON text, exactly as the model wrote it
    ]
)

MESSAGE_TYPE = pa.struct(
    [
        pa.field("role", pa.string()),
        pa.field("content", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        pa.field("tool_call_id", pa.string()),
        pa.field("name", pa.string()),
        pa.field("trainable", pa.bool_()),  # null: decided by role (assistant turns train)
    ]
)

TURN_TYPE = pa.struct(
    [
        pa.field("index", pa.int32()),
        pa.field("reward", pa.float64(), metadata=FINITE),
        pa.field("done", pa.bool_()),
        pa.field("latency_s", pa.float64()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("info", pa.string(), metadata=JSON_TEXT),
        pa.field("completion_ids", pa.list_(pa.int32())),
        pa.field("logprobs", pa.list_(pa.float32())),
    ]
)

TIMESTAMP = pa.timestamp("us", tz="UTC")

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("run_id", pa.string()),
        pa.field("round", pa.int32()),
        pa.field("task_id", pa.string(), metadata=KEY),
        pa.field("group_id", pa.string()),
        pa.field("sample", pa.int32()),
        pa.field("env", pa.string()),
        pa.field("model", pa.string()),
        pa.field("instruction", pa.string(), metadata=TEXT),
        pa.field("task", pa.string(), metadata=JSON_TEXT),  # gold answers included; never shown to the policy
        pa.field("tools", pa.string(), metadata=JSON_TEXT),  # a list of OpenAI function schemas
        pa.field("messages", pa.list_(MESSAGE_TYPE)),
        pa.field("turns", pa.list_(TURN_TYPE)),
        pa.field("reward", pa.float64(), metadata=FINITE),
        pa.field("success", pa.bool_()),
        pa.field("status", pa.string()),
        pa.field("error", pa.string()),
        pa.field("num_turns", pa.int32()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("source", pa.string()),
        pa.field("parent_id", pa.string()),
        pa.field("metadata", pa.string(), metadata=JSON_TEXT),
        pa.field("created_at", TIMESTAMP),
    ],
    metadata={"omrl.schema_version": str(SCHEMA_VERSION), "omrl.table": "trajectories"},
)

ANNOTATION_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("annotator", pa.string(), nullable=False),
        pa.field("kind", pa.string()),
        pa.field("score", pa.float64(), metadata=FINITE),
        pa.field("label", pa.string()),
        pa.field("rationale", pa.string()),
        pa.field("status", pa.string()),  # ok, or error: a failed judge or metric is never a score of 0
        pa.field("error", pa.string()),
        pa.field("judge_model", pa.string()),
        pa.field("rubric", pa.string()),
        pa.field("prompt_hash", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("run_id", pa.string()),
        pa.field("metadata", pa.string(), metadata=JSON_TEXT),
        pa.field("created_at", TIMESTAMP),
    ],
    metadata={"omrl.schema_version": str(SCHEMA_VERSION), "omrl.table": "annotations"},
)

SCHEMAS = {"trajectories": TRAJECTORY_SCHEMA, "annotations": ANNOTATION_SCHEMA}


def conform(table: pa.Table, name: str = "trajectories") -> pa.Table:
    """Cast a table read from an older or foreign file to the current schema; missing columns become null."""
    schema = SCHEMAS[name]
    columns = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            columns.append(col if col.type == f.type else col.cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)
