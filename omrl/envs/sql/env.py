"""`sql`: DBBench-style questions over a table loaded into a fresh in-memory SQLite database per episode."""

from __future__ import annotations

import contextlib
import json
import random
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass
from typing import Any

from omrl.envs.base import Action, Reset, StepResult, Task, tool_schema
from omrl.envs.expression import parse_number
from omrl.envs.toolenv import ToolEnv
from omrl.errors import UsageError

MAX_ROWS = 50          # rows shown per query result
MAX_CELL = 120         # characters shown per cell
MAX_VALUE_BYTES = 10_000_000  # largest string/blob one SQL value may hold
MAX_DB_MB = 64         # size cap of each episode's database (main and temp), PRAGMA max_page_count
MEMORY_MB = 256        # SQLite's heap cap, PRAGMA hard_heap_limit; per process: all SqlEnv databases together
# PRAGMAs the agent may give an argument to: they read the schema. Any other PRAGMA may only be read, so the
# caps above (and temp_store, the heap limits) cannot be changed by the agent's SQL.
_SCHEMA_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
                   "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"}
SYSTEM_PROMPT = ("You answer questions about a database table using SQL. Run queries with execute_sql; when a "
                 "question asks for values, call answer with them (a JSON list for several values). When the "
                 "task asks you to change the table, make the change with execute_sql and then call answer "
                 "with 'done'.")

TOOLS = [
    tool_schema("execute_sql", "Run one SQL statement on the database (SQLite dialect) and see its result.",
                {"query": {"type": "string", "description": "one SQL statement"}}),
    tool_schema("answer", "Give the final answer and end the episode: the value, or a JSON list of values; "
                "'done' after modifying the table.", {"value": {"type": "string"}}),
]
_TYPES = {"INT": "INTEGER", "INTEGER": "INTEGER", "REAL": "REAL", "FLOAT": "REAL", "DOUBLE": "REAL", "TEXT": "TEXT"}


@dataclass
class SqlOptions:
    """SqlEnv's constructor options, as `--env-option KEY=VALUE` gives them (checked by the recipe loader)."""

    max_rows: int = MAX_ROWS
    timeout_s: float = 5.0
    max_db_mb: int = MAX_DB_MB
    memory_mb: int = MEMORY_MB


class SqlEnv(ToolEnv):
    """DBBench-style SQL tasks: execute_sql(query) and answer(value) over an in-memory SQLite per episode."""

    name = "sql"
    options_class = SqlOptions
    tools = TOOLS

    def __init__(self, max_rows: int = MAX_ROWS, timeout_s: float = 5.0, max_db_mb: int = MAX_DB_MB,
                 memory_mb: int = MEMORY_MB) -> None:
        super().__init__()
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.max_db_mb = max_db_mb
        self.memory_mb = memory_mb
        self.db: sqlite3.Connection | None = None
        self.task: Task | None = None

    # ---------------------------------------------------------------- episode

    def reset(self, task: Task) -> Reset:
        self.close()
        super().__init__()
        table = task.payload.get("table")
        if not isinstance(table, dict):
            raise UsageError(f"sql task {task.id!r} has no table in its payload")
        self.task = task
        self.table_name = str(table["table_name"])
        self.kind = task.payload.get("kind") or "query"
        self.gold = gold_label(task)
        try:
            self.db = load_table(table, max_db_mb=self.max_db_mb, memory_mb=self.memory_mb)
        except (sqlite3.Error, MemoryError) as exc:
            raise UsageError(f"sql task {task.id!r}: its table does not load within the caps "
                             f"({self.max_db_mb} MB database, {self.memory_mb} MB memory): {exc}") from None
        self.queries = 0
        return Reset(observation=task.instruction, tools=list(TOOLS), system_prompt=SYSTEM_PROMPT)

    def close(self) -> None:
        super().close()
        if self.db is not None:
            self.db.close()
            self.db = None

    # ---------------------------------------------------------------- tools

    def text_action(self, text: str) -> Action:
        # AgentBench's own text format: a ```sql block to run, or "Final Answer: [...]".
        code = re.search(r"```(?:sql)?\s*(.+?)```", text or "", re.DOTALL)
        final = re.search(r"Final Answer:\s*(.+)", text or "", re.DOTALL)
        if final:
            return Action(tool="answer", arguments={"value": final.group(1).strip()})
        if code:
            return Action(tool="execute_sql", arguments={"query": code.group(1).strip()})
        return super().text_action(text)

    def tool_execute_sql(self, query: str) -> StepResult:
        self.queries += 1
        observation = run_query(self.db, str(query), self.max_rows, self.timeout_s, max_db_mb=self.max_db_mb,
                                memory_mb=self.memory_mb)
        # An SQL error is a legal move with an error result (as in AgentBench), not an invalid action.
        return StepResult(observation=observation, info={"tool": "execute_sql",
                                                         "sql_error": observation.startswith("Error:")})

    def tool_answer(self, value: Any) -> StepResult:
        self.done = True
        if self.kind == "mutation":
            expected = expected_table(self.task)
            correct = table_rows(self.db, self.table_name) == expected
        else:
            correct = answers_match(value, self.gold)
        return StepResult(observation="Correct." if correct else "Incorrect.", reward=1.0 if correct else 0.0,
                          done=True, info={"success": correct})

    # ---------------------------------------------------------------- scripted policies

    def expert_action(self) -> Action:
        """Look at the table, make the gold change (mutations), then answer the gold label."""
        if self.queries == 0:
            return Action(tool="execute_sql", arguments={"query": f"SELECT * FROM {quote(self.table_name)} LIMIT 3"})
        if self.kind == "mutation" and self.queries == 1:
            return Action(tool="execute_sql", arguments={"query": self.gold[0]})
        if self.kind == "mutation":
            return Action(tool="answer", arguments={"value": "done"})
        value = self.gold[0] if len(self.gold) == 1 else json.dumps(self.gold, ensure_ascii=False)
        return Action(tool="answer", arguments={"value": value})

    def random_action(self, rng: random.Random) -> Action:
        if rng.random() < 0.7:
            return Action(tool="execute_sql", arguments={"query": f"SELECT * FROM {quote(self.table_name)} "
                                                                  f"LIMIT {rng.randint(1, 5)}"})
        return Action(tool="answer", arguments={"value": str(rng.randint(0, 10))})


# -------------------------------------------------------------------- database helpers


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def load_table(table: dict[str, Any], max_db_mb: int = MAX_DB_MB, memory_mb: int = MEMORY_MB) -> sqlite3.Connection:
    """A new in-memory database holding one DBBench table (table_name, table_info{columns, rows}), capped."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    # The agent's SQL must not reach the disk (ATTACH / VACUUM INTO create files) nor build huge values.
    db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    cap_database(db, max_db_mb, memory_mb)
    info = table["table_info"]
    columns = [c["name"] if isinstance(c, dict) else str(c) for c in info["columns"]]
    types = [_TYPES.get(str(c.get("type", "TEXT")).upper(), "TEXT") if isinstance(c, dict) else "TEXT"
             for c in info["columns"]]
    ddl = ", ".join(f"{quote(name)} {kind}" for name, kind in zip(columns, types, strict=True))
    db.execute(f"CREATE TABLE {quote(table['table_name'])} ({ddl})")
    marks = ", ".join("?" for _ in columns)
    db.executemany(f"INSERT INTO {quote(table['table_name'])} VALUES ({marks})",
                   [list(row)[: len(columns)] + [None] * (len(columns) - len(row)) for row in info["rows"]])
    db.commit()
    db.set_authorizer(_authorize)  # last: the caps above are set; from here on the agent's SQL runs
    return db


def cap_database(db: sqlite3.Connection, max_db_mb: int, memory_mb: int) -> None:
    """Cap the database's size (main and temp) and SQLite's heap; temporary data is kept in that heap."""
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = max(1, (max_db_mb << 20) // page_size)
    db.execute(f"PRAGMA main.max_page_count = {pages}")
    db.execute("PRAGMA temp_store = MEMORY")  # sorts and temp tables in the capped heap, never temp files
    db.execute(f"PRAGMA temp.max_page_count = {pages}")
    heap = int(memory_mb) << 20
    current = db.execute("PRAGMA hard_heap_limit").fetchone()[0]
    if current == 0 or heap < current:  # process-wide: only ever lowered
        db.execute(f"PRAGMA hard_heap_limit = {heap}")


def _authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() not in _SCHEMA_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def run_query(db: sqlite3.Connection, query: str, max_rows: int = MAX_ROWS, timeout_s: float = 5.0,
              max_db_mb: int = MAX_DB_MB, memory_mb: int = MEMORY_MB) -> str:
    """Run one statement; the result (or the error) as text. Long queries are interrupted after timeout_s;
    statements that outgrow the database or memory caps fail with an error the agent can read."""
    import time

    deadline = time.monotonic() + timeout_s
    db.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    try:
        cursor = db.execute(query)
        if cursor.description is None:
            db.commit()
            return f"OK. {cursor.rowcount} row(s) affected."
        header = [d[0] for d in cursor.description]
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Warning as exc:  # e.g. two statements at once
        return f"Error: {exc}"
    except MemoryError:  # SQLite's heap cap (SQLITE_NOMEM)
        _rollback(db)
        return f"Error: out of memory: the statement needs more than the {memory_mb} MB the database may use"
    except sqlite3.Error as exc:
        text = str(exc)
        if "interrupted" in text:
            return f"Error: query took longer than {timeout_s} s and was stopped"
        if "database or disk is full" in text:
            _rollback(db)
            return f"Error: database is full: it may hold at most {max_db_mb} MB"
        if "not authorized" in text:
            return "Error: not authorized: PRAGMAs that change settings are refused"
        return f"Error: {exc}"
    finally:
        db.set_progress_handler(None, 0)
    return format_rows(header, rows, max_rows)


def _rollback(db: sqlite3.Connection) -> None:
    # After a failed statement that hit a cap, its open transaction holds the memory; give it back.
    with contextlib.suppress(sqlite3.Error):
        db.rollback()


def format_rows(header: list[str], rows: list[tuple], max_rows: int) -> str:
    shown = rows[:max_rows]
    lines = [" | ".join(header)]
    lines += [" | ".join(_cell(v) for v in row) for row in shown]
    if not shown:
        lines.append("(no rows)")
    if len(rows) > max_rows:
        lines.append(f"... more rows not shown (limit {max_rows})")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table_rows(db: sqlite3.Connection, table_name: str) -> Counter:
    """The table's contents as a multiset of normalized rows (order-insensitive)."""
    rows = db.execute(f"SELECT * FROM {quote(table_name)}").fetchall()
    return Counter(tuple(_normal(v) for v in row) for row in rows)


def expected_table(task: Task) -> Counter:
    """The table after applying the gold statement(s) to a fresh copy: what a mutation task must produce."""
    db = load_table(task.payload["table"])
    try:
        for statement in gold_label(task):
            db.execute(statement)
        return table_rows(db, task.payload["table"]["table_name"])
    finally:
        db.close()


def gold_label(task: Task) -> list[str]:
    label = task.payload.get("label")
    if label is None and task.answer is not None:
        try:
            label = json.loads(task.answer)
        except json.JSONDecodeError:
            label = [task.answer]
    if label is None:
        raise UsageError(f"sql task {task.id!r} has no gold label")
    return [str(v) for v in (label if isinstance(label, list) else [label])]


# -------------------------------------------------------------------- answer matching

_NONE = {"", "none", "null", "nan", "[]", "no result", "n/a"}


def _normal(value: Any) -> str:
    text = "" if value is None else str(value).strip().strip("'\"").strip()
    number = parse_number(text) if re.fullmatch(r"[-$\d.,%\s]+", text or "x") else None
    if number is not None:
        return repr(round(number, 6))
    return text.lower()


def answer_values(value: Any) -> list[str]:
    """An agent's answer as a list: a JSON list, a Python-looking list, or one value."""
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
            if isinstance(parsed, list):
                return [str(v) for v in parsed]
        except json.JSONDecodeError:
            import ast

            try:
                parsed = ast.literal_eval(text)
                if isinstance(parsed, (list, tuple)):
                    return [str(v) for v in parsed]
            except (ValueError, SyntaxError):
                pass
    return [text]


def answers_match(value: Any, gold: list[str]) -> bool:
    """Order-insensitive match of normalized values; numbers compare numerically; 'none' matches empty."""
    answer = [v for v in (_normal(x) for x in answer_values(value)) if v not in _NONE]
    expected = [v for v in (_normal(x) for x in gold) if v not in _NONE]
    return Counter(answer) == Counter(expected)
