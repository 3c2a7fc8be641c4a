"""Export a store (or a SQL selection of it) to files, and push an export to the Hugging Face Hub.

Formats (each JSONL one is re-importable with `omrl import`; what a round trip keeps is README's table,
which tests/test_loss_table.py measures):
  parquet   a new store folder (data/<table>/part-*.parquet, README.md dataset card, omrl.json), compacted:
            a valid Hugging Face dataset folder, loadable with `datasets.load_dataset(folder)`
  omrl      one omrl trajectory row per line, everything kept (re-importable with `omrl store append`);
            `jsonl` is the same format under its older name
  openai    {"messages", "tools", "task_id", "reward", "success", "model", "instruction"} per line: OpenAI
            fine-tuning / TRL conversational; trainable assistant turns as `weight` 0/1
  sharegpt  {"conversations": [{from, value, loss}], "tools", ...} per line (LLaMA-Factory roles)
  atif      Harbor's ATIF v1.7 trajectories (omrl.formats.atif): steps with tool calls, observations and
            per-step token metrics (prompt/completion token ids, logprobs); subagents embedded
  adp       Agent Data Protocol standardized: {id, content: [message/api actions, text observations], details}
  otel      OpenTelemetry GenAI spans (omrl.formats.otel): one OTLP JSON request per line (as the Collector's
            file exporter writes), a trace per trajectory: invoke_agent, chat per turn, execute_tool per call
  traces    a folder of Hugging Face Hub agent traces (omrl.formats.hf_traces): one session file per
            trajectory, which the Hub's trace viewer shows once pushed (--push); not re-importable
Installed packages add JSONL formats through the `omrl.exporters` entry-point group (omrl.formats.EXPORTERS).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from omrl.errors import UsageError
from omrl.formats import EXPORTERS
from omrl.schema.messages import arguments_value, to_openai, tool_call_parts
from omrl.schema.payloads import info_of, task_of, tools_of
from omrl.schema.rows import TrajectoryRow
from omrl.store import MANIFEST, Store, StoreError
from omrl.store.durable import staged_folder

# Written as folders by this module; every other format is an EXPORTERS entry (omrl.formats), one JSON
# record per line, which installed packages add to through the omrl.exporters entry-point group.
FOLDER_FORMATS = ("parquet", "traces")
# Files a store keeps for itself (locks, temporary parts): never part of an upload.
PUSH_IGNORE = [".*", "**/.*"]


@dataclass
class ExportResult:
    path: Path
    format: str
    trajectories: int
    annotations: int = 0


def export_formats() -> list[str]:
    """Every format `omrl export` writes: the folder ones, then the JSONL ones (built-in and plugins), by name."""
    return [*FOLDER_FORMATS, *EXPORTERS.names()]


def guess_format(out: str | Path) -> str:
    """parquet for a folder (no suffix), jsonl for a .jsonl/.json file."""
    suffix = Path(out).suffix.lower()
    if suffix == "":
        return "parquet"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise UsageError(f"cannot tell the export format from {out}; pass --format ({', '.join(export_formats())})")


def export_store(store: Store | str | Path, out: str | Path, fmt: str | None = None,
                 where: str | None = None, overwrite: bool = False) -> ExportResult:
    """Write the selected trajectories of a store to `out` in one of export_formats()."""
    store = store if isinstance(store, Store) else Store(store)
    out = Path(out)
    fmt = fmt or guess_format(out)
    if fmt not in FOLDER_FORMATS and EXPORTERS.get(fmt) is None:
        raise UsageError(f"unknown export format {fmt!r}; choose one of {', '.join(export_formats())}")
    refuse_unsafe_output(store, out, fmt, overwrite)
    rows = store.select(where)
    if fmt == "parquet":
        return _export_parquet(store, rows, out, where)
    if fmt == "traces":
        return _export_traces(store, rows, out, where)
    export_records = EXPORTERS.load(fmt)  # a plugin that cannot be imported stops here, before a file is opened
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in export_records(_rows(rows)):
                f.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
        os.replace(tmp, out)  # readers never see half a file
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed or interrupted export leaves no half-written temporary behind
        raise
    return ExportResult(out, fmt, rows.num_rows)


def refuse_unsafe_output(store: Store, out: Path, fmt: str, overwrite: bool) -> None:
    """Refuse an --out that would write into or over a store or someone's files, each with one line.

    Never inside a store (the source or any other folder holding omrl.json, the output and its parents
    checked), never a store except an earlier parquet export that --overwrite replaces (not the source),
    never a folder holding a store; a file for the JSONL formats, not a folder; and, without --overwrite,
    nothing that exists and is not empty. With --overwrite, traces replace only an earlier traces export
    (parquet's Store.staged applies the same rule to stores)."""
    here = out.resolve()
    for folder in here.parents:
        if (folder / MANIFEST).is_file():
            raise StoreError(f"--out {out} is inside the store {folder}: the export would write into it; give a "
                             "path outside any store")
    if (here / MANIFEST).is_file():
        _refuse_store_output(store, out, fmt, overwrite)
    writes_folder = fmt in FOLDER_FORMATS
    if out.exists() and out.is_dir() != writes_folder:
        raise StoreError(f"--out {out} is a {'file' if writes_folder else 'folder'}; --format {fmt} writes "
                         f"{'a folder' if writes_folder else 'one file'}: give another path")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not overwrite:
        raise StoreError(f"{out} already exists; choose another --out or pass --overwrite")
    if out.is_dir():
        _refuse_folder_holding_a_store(out, here)
    if fmt == "traces" and not _is_traces_export(out):
        raise StoreError(f"--out {out} is not empty and is not an earlier traces export (README.md and sessions/ "
                         "only): --overwrite would delete it; give a new or empty folder")


def _refuse_store_output(store: Store, out: Path, fmt: str, overwrite: bool) -> None:
    """`out` holds a store: only an earlier parquet export that is not the source may be replaced (--overwrite)."""
    source = store.path.resolve() if isinstance(store.path, Path) else None
    if out.resolve() == source:
        raise StoreError(f"--out {out} is the store being exported: the export would replace it; give another path")
    if fmt != "parquet":
        raise StoreError(f"--out {out} is a store: --format {fmt} would replace its files; give a path outside "
                         "any store")
    if overwrite and not _is_export(out):
        raise StoreError(f"--out {out} is a store that is not an earlier export: --overwrite replaces only an "
                         "export (its omrl.json lineage starts with export); give another path")


def _is_export(root: Path) -> bool:
    """Whether the store at `root` was made by `omrl export` (its lineage starts with an export)."""
    from omrl.store.manifest import parse_manifest

    try:
        lineage = parse_manifest((root / MANIFEST).read_bytes(), str(root / MANIFEST)).get("lineage") or []
    except StoreError:  # a damaged manifest: not known to be an export, so not replaced
        return False
    return bool(lineage) and isinstance(lineage[0], dict) and lineage[0].get("op") == "export"


def _refuse_folder_holding_a_store(out: Path, here: Path) -> None:
    for folder, _dirs, files in os.walk(out):
        if MANIFEST in files and Path(folder).resolve() != here:
            raise StoreError(f"--out {out} holds the store {folder}: --overwrite would delete it; give another folder")


def _is_traces_export(out: Path) -> bool:
    """Whether a folder is what a traces export writes: README.md and sessions/ and nothing else."""
    names = {child.name for child in out.iterdir()}
    return names <= {"README.md", "sessions"} and (out / "README.md").is_file()


def _export_traces(store: Store, rows: pa.Table, out: Path, where: str | None) -> ExportResult:
    """A folder of Hub session-trace files (one per trajectory) and a dataset card, staged and renamed in whole."""
    from omrl.formats import hf_traces

    if out.suffix.lower() in (".jsonl", ".json"):
        raise UsageError(f"--format traces writes a folder (one file per trajectory), not {out.name}")
    description = f"Exported from `{store.path.name}`" + (f" where `{where}`." if where else ".")
    with staged_folder(out) as folder:
        (folder / "README.md").write_text(hf_traces.CARD.format(description=description), encoding="utf-8")
        for row in _rows(rows):
            path = folder / hf_traces.session_path(row["id"])
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = hf_traces.session_lines(row)
            path.write_text("".join(json.dumps(line, ensure_ascii=False, default=_json_default) + "\n"
                                    for line in lines), encoding="utf-8")
    return ExportResult(out, "traces", rows.num_rows)


def _rows(rows: pa.Table) -> Iterator[TrajectoryRow]:
    """The table's trajectory rows, a thousand at a time from Arrow."""
    for batch in rows.to_batches(max_chunksize=1000):
        yield from batch.to_pylist()


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


# The built-in JSONL exporters (EXPORTERS' targets): trajectory rows in, one JSON record per row out.


def omrl_records(rows: Iterable[TrajectoryRow]) -> Iterator[TrajectoryRow]:
    """omrl rows as they are, everything kept (re-importable with `omrl store append`)."""
    return iter(rows)


def openai_records(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    return (to_openai_record(row) for row in rows)


def sharegpt_records(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    return (to_sharegpt_record(row) for row in rows)


def adp_records(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    return (to_adp_record(row) for row in rows)


def swebench_predictions(rows: Iterable[TrajectoryRow]) -> Iterator[dict[str, Any]]:
    return (to_swebench_prediction(row) for row in rows)


def _tools(row: TrajectoryRow) -> list[Any]:
    return tools_of(row)


def _outcome(row: TrajectoryRow) -> dict[str, Any]:
    """The top-level keys the openai and sharegpt importers map back: task id, reward, success, model, instruction."""
    out = {"task_id": row.get("task_id"), "reward": row.get("reward"), "success": row.get("success"),
           "model": row.get("model"), "instruction": row.get("instruction")}
    return {k: v for k, v in out.items() if v not in (None, "")}


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Schema messages in the OpenAI fine-tuning form (omrl.schema.messages.to_openai with reasoning and weights)."""
    return to_openai(messages, export=True)


def to_openai_record(row: TrajectoryRow) -> dict[str, Any]:
    """{"messages", "tools"} (one fine-tuning example) with the task id, reward, success, model and instruction beside."""
    return {"messages": to_openai_messages(row["messages"]), "tools": _tools(row), **_outcome(row)}


def to_swebench_prediction(row: TrajectoryRow) -> dict[str, Any]:
    """SWE-bench's prediction record: instance_id, model_name_or_path and model_patch, the diff the episode's
    submit produced (turns.info.model_patch; "" when it never submitted)."""
    task = task_of(row)
    payload = task.get("payload") or {}
    payload = json.loads(payload) if isinstance(payload, str) else payload
    patch = ""
    for turn in reversed(row.get("turns") or []):
        info = info_of(turn)
        if isinstance(info.get("model_patch"), str):
            patch = info["model_patch"]
            break
    return {"instance_id": payload.get("instance_id") or row["task_id"], "model_name_or_path": row.get("model") or "",
            "model_patch": patch}


SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}


def to_sharegpt_record(row: TrajectoryRow) -> dict[str, Any]:
    """ShareGPT with LLaMA-Factory's tool roles: an assistant's tool calls follow it as a `function_call` turn.

    Call arguments are written as objects (LLaMA-Factory's form), so their JSON text may be re-spaced; the
    training flag is `loss` on every turn; a tool result names its function (it is linked back by name
    and order: ShareGPT has no call ids on results).
    """
    conversations = []
    previous = None
    for m in row["messages"]:
        flag = {} if m.get("trainable") is None else {"loss": bool(m["trainable"])}
        calls = m["tool_calls"] or []
        # A text turn unless the message is calls only (no text, no reasoning): a function_call turn right
        # after a gpt turn is read back as that same message's calls, so a calls-only message after an
        # assistant text message gets an empty gpt turn of its own (it reads back with content "").
        after_text = previous is not None and previous["role"] == "assistant" and not previous["tool_calls"]
        previous = m
        if (m["role"] != "assistant" or not calls or m["content"] is not None or m.get("reasoning") is not None
                or after_text):
            turn = {"from": SHAREGPT_ROLES[m["role"]], "value": m["content"] or "", **flag}
            if m.get("name"):
                turn["name"] = m["name"]
            if m.get("reasoning") is not None:  # not in ShareGPT proper; kept so a re-import loses nothing
                turn["reasoning"] = m["reasoning"]
            conversations.append(turn)
        if calls:
            parts = [{"id": cid, "name": name, "arguments": arguments_value(args)}
                     for cid, name, args in map(tool_call_parts, calls)]
            value = parts[0] if len(parts) == 1 else parts
            conversations.append({"from": "function_call", "value": json.dumps(value, ensure_ascii=False), **flag})
    out: dict[str, Any] = {"conversations": conversations}
    tools = _tools(row)
    if tools:
        out["tools"] = json.dumps(tools, ensure_ascii=False)
    return {**out, **_outcome(row)}


def to_adp_record(row: TrajectoryRow) -> dict[str, Any]:
    """One ADP standardized trajectory: user and tool messages as text observations, assistant text as a
    message_action (reasoning as its description), each tool call as an api_action with its id.

    ADP has no system role: the system prompt goes to `details.system`, out of the conversation."""
    content: list[dict[str, Any]] = []
    system = []
    for m in row["messages"]:
        role = m["role"]
        if role == "system":
            system.append(m["content"] or "")
        elif role in ("user", "tool"):
            item = {"class_": "text_observation", "content": m["content"],
                    "source": "user" if role == "user" else "environment"}
            if m.get("name") and role == "user":
                item["name"] = m["name"]
            content.append(item)
        else:
            described = False
            if m["content"] or not m["tool_calls"]:  # an empty text beside calls is no action of its own
                content.append({"class_": "message_action", "content": m["content"], "description": m.get("reasoning")})
                described = True
            for cid, name, args in map(tool_call_parts, m["tool_calls"] or []):
                content.append({"class_": "api_action", "id": cid, "function": name, "kwargs": arguments_value(args),
                                "description": None if described else m.get("reasoning")})
                described = True
    details: dict[str, Any] = {"reward": row.get("reward"), "success": row.get("success"), "model": row.get("model"),
                               "tools": _tools(row) or None, "system": "\n\n".join(system) if system else None,
                               "omrl_id": row.get("id")}
    return {"id": row.get("task_id"), "content": content, "details": {k: v for k, v in details.items() if v is not None}}


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
