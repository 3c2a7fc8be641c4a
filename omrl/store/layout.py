"""The physical layout of a store part (schema version 2): Parquet write options, flat side data, auto-compaction.

The logical layout (columns, one row per trajectory, what `load_dataset` reads) is the schema's; this
module decides only how a part's bytes are laid out and what travels beside it:

- Exact repeats (a system prompt, the tool outputs the samples of one GRPO group share, a file read again
  and again) are stored once per row group by Parquet's dictionary encoding, with a dictionary page limit
  sized for message text (Arrow's default of 1 MB falls back to plain encoding after the first megabyte,
  which is why v1 stored every repeat again).
- A flat `tool_calls` side file per trajectories part (one row per tool call), so the `tool_calls` view
  reads three narrow columns instead of unnesting every conversation. Side files live in the table's
  hidden `.side/` folder, are written and renamed in before their part, carry the part's name and row
  count (a side file that does not match is ignored), and are never listed in the dataset card.
- When small parts accumulate, appends compact them (`CompactPolicy`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from omrl.errors import UsageError
from omrl.store.storage import StorePath

ZSTD_LEVEL = 3  # levels 6 and 9 made content 4-11% smaller but writes 2-3.5x slower (benchmarks/store_bench.py)
# Per column, measured on a compacted 5,000-row store_bench part (15.9 MB; write CPU 1.7 s): message content
# is 90% of it (14.3 MB; 48 MB after dictionary dedup), so only its encoding matters. zstd 6: -3.5%, 1.7x the
# CPU; zstd 9: -5%, 2.7x; 16 MB row groups: -5% at the same CPU, but a viewer page decodes its whole group
# (2.6x slower, see ROW_GROUP_BYTES); 16 MB and zstd 9: -14%, 2.7x. The small columns are best as they are:
# delta-packed integers and byte-stream-split floats instead of dictionaries made the part 0.8% larger.
# Dictionary pages up to this size: one row group's distinct message texts always fit (a giant row included).
DICTIONARY_PAGE_BYTES = 256 * 1024 * 1024
# Row groups of about this many uncompressed bytes, counted per row (message text exactly, the other
# columns at their average). A viewer's trajectory page decodes its row's whole group, so the group's size
# is the page's cost; smaller groups store repeats once per group, so files grow. Measured on a 5,000-row
# store_bench corpus (105 MB of text; 2 loaded cores), file size / median time to read one trajectory's
# group: 32 MB 14.9 MB / 263 ms, 16 MB +1% / 150 ms, 8 MB +3% / 100 ms, 4 MB +7% / 57 ms, 2 MB +12% / 44 ms.
# 4 MB keeps a page well inside the viewer's 100 ms for a few percent of size; below it size grows faster
# than reads shrink (the footer and per-group set-up start to count).
ROW_GROUP_BYTES = 4 * 1024 * 1024
MAX_ROW_GROUP_ROWS = 16_384  # small rows: a bound on rows per group all the same (footer and scan granularity)
SIDE_DIR = ".side"  # hidden: never listed in the card, left out of Hub uploads (hub.PUSH_IGNORE)
SIDE_KINDS = ("tool_calls",)
SIDE_OF_KEY = b"omrl.side_of"  # the part a side file belongs to
SIDE_ROWS_KEY = b"omrl.part_rows"  # and that part's row count: a side file from another part never matches

TOOL_CALLS_SCHEMA = pa.schema([
    pa.field("trajectory_id", pa.string()),
    pa.field("run_id", pa.string()),
    pa.field("round", pa.int32()),
    pa.field("task_id", pa.string()),
    pa.field("env", pa.string()),
    pa.field("message_position", pa.int64()),
    pa.field("call_index", pa.int64()),
    pa.field("id", pa.string()),
    pa.field("name", pa.string()),
    pa.field("arguments", pa.string()),
])


class BinarySink(Protocol):
    """Where Parquet bytes go: a binary file, or a wrapper that counts and hashes them (omrl.store.manifest)."""

    def write(self, data: bytes, /) -> int: ...


def write_parquet(data: pa.Table, sink: str | os.PathLike[str] | BinarySink, row_group_rows: int | None = None) -> None:
    """Write `data` with the v2 options: zstd, dictionary pages sized for repeated message text, page
    checksums, row groups of `row_group_rows` rows each or, when None, of about ROW_GROUP_BYTES each
    (`row_group_sizes`)."""
    sizes = row_group_sizes(data) if row_group_rows is None else _even_sizes(data.num_rows, row_group_rows)
    # Statistics on top-level columns only: DuckDB prunes row groups with them (ids, rounds, rewards), but
    # nothing filters on min/max of nested message text, whose statistics took ~40% of the write time.
    top_level = [f.name for f in data.schema if not pa.types.is_nested(f.type)]
    # Page checksums: readers that verify them (omrl's queries and checks) fail on a flipped bit instead of
    # answering from it; they cost 4 bytes a page and no measurable write time.
    with pq.ParquetWriter(sink, data.schema, compression="zstd", compression_level=ZSTD_LEVEL,
                          dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES, write_statistics=top_level,
                          write_page_checksum=True) as writer:
        start = 0
        for size in sizes:  # one write per row group: ParquetWriter starts a new group at each call
            writer.write_table(data.slice(start, size), row_group_size=size)
            start += size
        if not sizes:
            writer.write_table(data)  # no rows: the schema alone (a file readers can open)


def _even_sizes(num_rows: int, per_group: int) -> list[int]:
    full, rest = divmod(num_rows, max(1, per_group))
    return [per_group] * full + ([rest] if rest else [])


def row_bytes(data: pa.Table) -> np.ndarray:
    """Uncompressed bytes of each row: its message text (content, reasoning, tool-call arguments) exactly,
    every other column at its average per row (they vary little; message text varies a thousandfold)."""
    out = np.zeros(data.num_rows, dtype=np.int64)
    if data.num_rows == 0:
        return out
    text = 0
    if "messages" in data.column_names:
        start = 0
        for chunk in data.column("messages").chunks:
            parents, _ = _positions(chunk)
            flat = chunk.flatten()
            per_message = _text_bytes(pc.struct_field(flat, "content")) + _text_bytes(pc.struct_field(flat, "reasoning"))
            calls = pc.struct_field(flat, "tool_calls")
            call_message, _ = _positions(calls)
            arguments = _text_bytes(pc.struct_field(calls.flatten(), "arguments"))
            per_message += np.bincount(call_message, weights=arguments, minlength=len(flat)).astype(np.int64)
            out[start:start + len(chunk)] = np.bincount(parents, weights=per_message, minlength=len(chunk))
            start += len(chunk)
        text = int(out.sum())
    out += max(0, data.nbytes - text) // data.num_rows
    return out


def _text_bytes(strings: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.binary_length(strings), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def row_group_sizes(data: pa.Table, target: int | None = None) -> list[int]:
    """Rows per row group: a row starts a new group when the bytes before it cross a multiple of `target`
    (ROW_GROUP_BYTES when None): a group holds less than `target` bytes before its last row, a giant row
    ends its group; at most MAX_ROW_GROUP_ROWS rows."""
    target = target or ROW_GROUP_BYTES
    sizes = row_bytes(data)
    if len(sizes) == 0:
        return []
    before = np.cumsum(sizes) - sizes
    _, counts = np.unique(before // max(1, target), return_counts=True)  # non-decreasing: runs in order
    return [part for count in counts.tolist() for part in _even_sizes(count, MAX_ROW_GROUP_ROWS)]


# ------------------------------------------------------------------------------------------ side data


def side_path(part: StorePath, kind: str = "tool_calls") -> StorePath:
    """Where the `kind` side file of a part lives (not a `part-*.parquet` name: never taken for a part)."""
    return part.parent / SIDE_DIR / f"{part.stem}.{kind}.parquet"


def part_of_side(side: StorePath) -> str:
    """The name of the part a side file belongs to."""
    stem = side.name.removesuffix(".parquet")
    return stem.rsplit(".", 1)[0] + ".parquet"


def _positions(lists: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(parent row, index within its list) of every value of `lists`, in flatten order (nulls hold none)."""
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    parents = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    return parents, np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)


def tool_calls_table(data: pa.Table) -> pa.Table:
    """One row per tool call of a trajectories table, in the `tool_calls` view's columns and order; chunk by
    chunk (a compaction's table holds every part it merges: copying its conversations into one array took
    a fifth of the compaction)."""
    rows, positions, indexes, calls_of = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], []
    first = 0
    for chunk in data.column("messages").chunks:
        message_row, position = _positions(chunk)
        calls = pc.struct_field(chunk.flatten(), "tool_calls")
        call_message, call_index = _positions(calls)
        rows.append(message_row[call_message] + first)
        positions.append(position[call_message])
        indexes.append(call_index)
        calls_of.append(calls.flatten())
        first += len(chunk)
    taken = pa.array(np.concatenate(rows))
    columns = {name: data.column(name).take(taken) for name in ("id", "run_id", "round", "task_id", "env")}
    fields = {name: pa.chunked_array([pc.struct_field(c, name) for c in calls_of], TOOL_CALLS_SCHEMA.field(name).type)
              for name in ("id", "name", "arguments")}
    return pa.Table.from_arrays(
        [columns["id"], columns["run_id"], columns["round"], columns["task_id"], columns["env"],
         pa.array(np.concatenate(positions)), pa.array(np.concatenate(indexes)), fields["id"], fields["name"],
         fields["arguments"]], schema=TOOL_CALLS_SCHEMA)


SIDE_BUILDERS = {"tool_calls": tool_calls_table}
SIDE_SCHEMAS = {"tool_calls": TOOL_CALLS_SCHEMA}


def side_tables(data: pa.Table, part_name: str) -> dict[str, pa.Table]:
    """The side tables of a trajectories part, each stamped with the part's name and row count."""
    return {kind: stamped(build(data), part_name, data.num_rows) for kind, build in SIDE_BUILDERS.items()}


def stamped(side: pa.Table, part_name: str, part_rows: int) -> pa.Table:
    """A side table marked as belonging to the part `part_name` of `part_rows` rows (`side_matches`)."""
    return side.replace_schema_metadata({SIDE_OF_KEY: part_name.encode(), SIDE_ROWS_KEY: str(part_rows).encode()})


def side_matches(side: Path, part_name: str, part_rows: int) -> bool:
    """Whether `side` is a readable side file of exactly this part (else readers unnest the part)."""
    try:
        meta = pq.read_metadata(side).metadata or {}
    except FileNotFoundError:
        return False
    except Exception as exc:  # a truncated or garbage side file: the part itself still answers
        warnings.warn(f"ignoring unreadable side file {side}: {type(exc).__name__}: {exc}", stacklevel=2)
        return False
    return meta.get(SIDE_OF_KEY) == part_name.encode() and meta.get(SIDE_ROWS_KEY) == str(part_rows).encode()


# --------------------------------------------------------------------------------- auto-compaction


@dataclass(frozen=True)
class CompactPolicy:
    """When appends compact a table: once `small_parts` parts smaller than `small_part_bytes` each exist.

    Only those small parts are merged (large parts are not rewritten again and again); `small_parts` 0
    turns automatic compaction off. Stored in the manifest's "auto_compact" object.
    """

    small_parts: int = 32
    small_part_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.small_parts < 0 or self.small_part_bytes <= 0:
            raise UsageError(f"auto_compact needs small_parts >= 0 and small_part_bytes > 0, got {asdict(self)}")
        if self.small_parts == 1:
            raise UsageError("auto_compact small_parts must be 0 (off) or at least 2 (one part is never merged)")

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> CompactPolicy:
        """The policy a manifest states (defaults for what it leaves out, v1 stores included)."""
        given = manifest.get("auto_compact") or {}
        names = {f.name for f in fields(cls)}
        unknown = set(given) - names
        if unknown:
            raise UsageError(f"unknown auto_compact setting(s) {sorted(unknown)}; known: {sorted(names)}")
        return cls(**{k: int(v) for k, v in given.items()})

    def small(self, parts: list[StorePath]) -> list[StorePath]:
        """The parts small enough to merge, or [] while there are too few of them to bother."""
        if self.small_parts == 0:
            return []
        small = []
        for part in parts:
            try:
                if part.stat().st_size < self.small_part_bytes:
                    small.append(part)
            except FileNotFoundError:  # compacted away meanwhile
                continue
        return small if len(small) >= self.small_parts else []
