"""Export a store (or a SQL selection of it) to files, and push an export to the Hugging Face Hub.

Formats:
  parquet   a new store folder (data/<table>/part-*.parquet, README.md dataset card, omrl.json), compacted:
            a valid Hugging Face dataset folder, loadable with `datasets.load_dataset(folder)`
  jsonl     one omrl trajectory row per line (re-importable with `omrl store append`)
  openai    {"messages", "tools"} per line: what OpenAI fine-tuning and TRL's SFTTrainer take
  sharegpt  {"id", "conversations": [{from, value}], "tools", "reward"} per line (LLaMA-Factory roles)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.messages import arguments_value, to_openai, tool_call_parts
from omrl.store import Store, StoreError

EXPORT_FORMATS = ("parquet", "jsonl", "openai", "sharegpt")
# Files a store keeps for itself (locks, temporary parts): never part of an upload.
PUSH_IGNORE = [".*", "**/.*"]


@dataclass
class ExportResult:
    path: Path
    format: str
    trajectories: int
    annotations: int = 0


def guess_format(out: str | Path) -> str:
    """parquet for a folder (no suffix), jsonl for a .jsonl/.json file."""
    suffix = Path(out).suffix.lower()
    if suffix == "":
        return "parquet"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise ValueError(f"cannot tell the export format from {out}; pass --format ({', '.join(EXPORT_FORMATS)})")


def select_rows(store: Store, where: str | None = None) -> pa.Table:
    """The store's trajectories, or those matching a SQL WHERE clause over the `trajectories` view."""
    table = store.read("trajectories")
    if not where:
        return table
    from omrl.query import select_ids  # one checked condition, never pasted into SQL

    ids = pa.array(select_ids(store, where), pa.string())
    return table.filter(pc.is_in(table.column("id"), value_set=ids))


def export_store(store: Store | str | Path, out: str | Path, fmt: str | None = None,
                 where: str | None = None, overwrite: bool = False) -> ExportResult:
    """Write the selected trajectories of a store to `out` in one of EXPORT_FORMATS."""
    store = store if isinstance(store, Store) else Store(store)
    out = Path(out)
    fmt = fmt or guess_format(out)
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if out.exists() and not overwrite and (out.is_file() or any(out.iterdir())):
        raise StoreError(f"{out} already exists; choose another --out or pass --overwrite")
    rows = select_rows(store, where)
    if fmt == "parquet":
        return _export_parquet(store, rows, out, where)
    convert = {"jsonl": _jsonable_row, "openai": to_openai_record, "sharegpt": to_sharegpt_record}[fmt]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for batch in rows.to_batches(max_chunksize=1000):
                for row in batch.to_pylist():
                    f.write(json.dumps(convert(row), ensure_ascii=False, default=_json_default) + "\n")
        os.replace(tmp, out)  # readers never see half a file
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed or interrupted export leaves no half-written temporary behind
        raise
    return ExportResult(out, fmt, rows.num_rows)


def _export_parquet(store: Store, rows: pa.Table, out: Path, where: str | None) -> ExportResult:
    description = f"Exported from `{store.path.name}`" + (f" where `{where}`." if where else ".")
    lineage = {"op": "export", "source": str(store.path.resolve()), "where": where, "rows": rows.num_rows}
    annotations = store.read("annotations")
    if where and annotations.num_rows:
        annotations = annotations.filter(pc.is_in(annotations.column("trajectory_id"),
                                                  value_set=rows.column("id").combine_chunks()))
    # Staged and renamed in whole; an earlier export at `out` (--overwrite) is swapped out only then.
    with Store.staged(out, description=description, lineage=lineage, replace=True) as target:
        if rows.num_rows:
            target.append(rows)
        if annotations.num_rows:
            target.append(annotations, table="annotations")
    return ExportResult(out, "parquet", rows.num_rows, annotations.num_rows)


# ---------------------------------------------------------------- row conversions


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    return row


def _tools(row: dict[str, Any]) -> list[Any]:
    return json.loads(row.get("tools") or "[]")


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Schema messages in the OpenAI fine-tuning form (omrl.messages.to_openai with reasoning and weights)."""
    return to_openai(messages, export=True)


def to_openai_record(row: dict[str, Any]) -> dict[str, Any]:
    """{"messages", "tools"}: one fine-tuning example."""
    return {"messages": to_openai_messages(row["messages"]), "tools": _tools(row)}


SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}


def to_sharegpt_record(row: dict[str, Any]) -> dict[str, Any]:
    """ShareGPT with LLaMA-Factory's tool roles: an assistant's tool calls follow it as a `function_call` turn.

    Call arguments are written as objects (LLaMA-Factory's form), so their JSON text may be re-spaced.
    """
    conversations = []
    for m in row["messages"]:
        flag = {} if m.get("trainable") is None else {"loss": bool(m["trainable"])}
        if m["role"] != "assistant" or m["content"] or not m["tool_calls"]:
            turn = {"from": SHAREGPT_ROLES[m["role"]], "value": m["content"] or "", **flag}
            if m.get("reasoning") is not None:  # not in ShareGPT proper; kept so a re-import loses nothing
                turn["reasoning"] = m["reasoning"]
            conversations.append(turn)
        if m["tool_calls"]:
            calls = [{"id": cid, "name": name, "arguments": arguments_value(args)}
                     for cid, name, args in map(tool_call_parts, m["tool_calls"])]
            value = calls[0] if len(calls) == 1 else calls
            conversations.append({"from": "function_call", "value": json.dumps(value, ensure_ascii=False), **flag})
    out = {"id": row["id"], "conversations": conversations}
    tools = _tools(row)
    if tools:
        out["tools"] = json.dumps(tools, ensure_ascii=False)
    if row.get("reward") is not None:
        out["reward"] = row["reward"]
    return out


# ---------------------------------------------------------------- push


def push_to_hub(path: str | Path, repo_id: str, private: bool = False, token: str | None = None,
                endpoint: str | None = None, commit_message: str | None = None) -> str:
    """Upload an export (a folder, or one file) to a Hub dataset repo; returns the commit URL.

    The endpoint defaults to HF_ENDPOINT / huggingface.co, as huggingface_hub decides.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: nothing to push")
    api = HfApi(endpoint=endpoint, token=token)
    folder, allow = (path, None) if path.is_dir() else (path.parent, [path.name])
    message = commit_message or f"omrl export ({path.name})"
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type="dataset", allow_patterns=allow,
                                 ignore_patterns=PUSH_IGNORE, commit_message=message)
    except OfflineModeIsEnabled as exc:
        raise StoreError(f"cannot push to the Hub: {exc}") from None
    except HfHubHTTPError as exc:
        raise StoreError(f"pushing to {repo_id} failed: {exc}") from None
    return str(info.commit_url)
