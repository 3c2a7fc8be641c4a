"""The trajectory and annotation formats: the one source of truth for every column omrl stores.

The package's public names, from the modules that define them: tables (the Arrow schemas), rows (the row
types), normalise (records and normalisers), outcomes (the success rate), ids, task_column, payloads (the
JSON-text columns read), json_schemas, surrogates; arrow, messages and redact are imported by their paths.
"""

from omrl.schema.convert import SchemaError
from omrl.schema.ids import group_id, new_id, trajectory_id, utcnow
from omrl.schema.json_schemas import SCHEMA_FILES, json_schema
from omrl.schema.normalise import (
    NORMALIZERS,
    Annotation,
    Message,
    NormalizedRow,
    ToolCall,
    Trajectory,
    Turn,
    is_normalized,
    normalize_annotation,
    normalize_trajectory,
)
from omrl.schema.outcomes import (
    SUCCESS_RATE_SQL,
    SUCCESS_SQL,
    SuccessCounts,
    is_failed,
    success_counts,
    success_sql,
)
from omrl.schema.payloads import info_of, metadata_of, task_of, tools_of
from omrl.schema.rows import AnnotationRow, MessageRow, ToolCallRow, TrajectoryRow, TurnRow
from omrl.schema.surrogates import replace_lone_surrogates
from omrl.schema.tables import (
    ANNOTATION_KINDS,
    ANNOTATION_SCHEMA,
    ANNOTATION_STATUSES,
    FAILED_STATUSES,
    FINISHED_STATUSES,
    MESSAGE_TYPE,
    ROLES,
    ROW_SCHEMA_VERSION,
    SCHEMA_VERSION,
    SCHEMAS,
    STATUSES,
    TIMESTAMP,
    TOOL_CALL_TYPE,
    TRAJECTORY_SCHEMA,
    TURN_TYPE,
    conform,
)
from omrl.schema.task_column import TASK_PAYLOAD_SQL, parse_task, task_payload_sql

__all__ = [
    "ANNOTATION_KINDS", "ANNOTATION_SCHEMA", "ANNOTATION_STATUSES", "FAILED_STATUSES", "FINISHED_STATUSES",
    "MESSAGE_TYPE", "NORMALIZERS", "AnnotationRow", "MessageRow", "ToolCallRow", "TrajectoryRow", "TurnRow",
    "info_of", "metadata_of", "task_of", "tools_of", "ROLES", "ROW_SCHEMA_VERSION", "SCHEMAS", "SCHEMA_FILES", "SCHEMA_VERSION",
    "STATUSES", "SUCCESS_RATE_SQL", "SUCCESS_SQL", "TASK_PAYLOAD_SQL", "TIMESTAMP", "TOOL_CALL_TYPE",
    "TRAJECTORY_SCHEMA", "TURN_TYPE", "Annotation", "Message", "NormalizedRow", "SchemaError", "SuccessCounts",
    "ToolCall", "Trajectory", "Turn", "conform", "group_id", "is_failed", "is_normalized", "json_schema",
    "new_id", "normalize_annotation", "normalize_trajectory", "parse_task", "replace_lone_surrogates",
    "success_counts", "success_sql", "task_payload_sql", "trajectory_id", "utcnow",
]
