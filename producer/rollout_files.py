"""Rollout files: JSONL lines or Parquet rows, read as the same records.

A Parquet file (``.parquet`` / ``.pq``) needs pyarrow, the ``parquet`` extra. Its rows come
back as the dicts a JSONL line decodes to (list columns as lists, struct columns as dicts,
missing struct fields as None), so both kinds go through ``rollouts.calls_in_record``.
Only the columns a record shape uses are read: datasets often carry large others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from codepool.common.errors import InputError, MissingExtra
from codepool.producer.rollouts import RecordedCall, RolloutError, calls_in_record

PARQUET_SUFFIXES = (".parquet", ".pq")
COLUMNS = ("id", "code", "observation", "messages", "stdin", "files", "fetch_files")
TYPED_COLUMNS = ("code", "observation", "messages")  # whose type must fit the record shape
BATCH_ROWS = 1024
INSTALL_HINT = "pip install 'codepool[parquet]'"


def is_parquet(path: str) -> bool:
    return path.lower().endswith(PARQUET_SUFFIXES)


def check_readable(path: str) -> None:
    """Raise InputError or MissingExtra when ``path`` cannot be read as rollouts at all
    (before anything is started for it)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    if is_parquet(path):
        _open_parquet(path)


def read_calls(path: str) -> Iterator[RecordedCall | RolloutError]:
    """Every call in a rollout file, in order; bad records come back as RolloutError."""
    unit = "row" if is_parquet(path) else "line"
    records = _parquet_rows(path) if unit == "row" else _jsonl_records(path)
    for number, record in records:
        if isinstance(record, RolloutError):
            yield record
            continue
        try:
            yield from calls_in_record(record, number, unit=unit)
        except RolloutError as exc:
            yield exc


def _jsonl_records(path: str) -> Iterator[tuple[int, Any]]:
    # Bad UTF-8 in a line becomes U+FFFD, as it would in an observation.
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, RolloutError(f"line {number}: not JSON ({exc.msg})")


def _parquet_rows(path: str) -> Iterator[tuple[int, Any]]:
    parquet, pyarrow = _open_parquet(path)
    names = set(parquet.schema_arrow.names)
    columns = [name for name in COLUMNS if name in names]
    number = 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except pyarrow.ArrowException as exc:
        raise InputError(f"{path}: unreadable after row {number} ({exc})") from None


def _open_parquet(path: str) -> tuple[Any, ModuleType]:
    """The file opened with pyarrow and its schema checked; and the pyarrow module."""
    pyarrow, pq = _pyarrow()
    try:
        parquet = pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    schema = parquet.schema_arrow
    if "code" not in schema.names and "messages" not in schema.names:
        shown = ", ".join(schema.names[:12]) + (" ..." if len(schema.names) > 12 else "")
        raise InputError(
            f"{path}: no 'code' or 'messages' column (columns: {shown or 'none'}); "
            "rows must have the shape of the JSONL records"
        )
    for name in TYPED_COLUMNS:
        if name in schema.names:
            column_type = schema.field(name).type
            wanted = "a list of messages" if name == "messages" else "a string"
            if not _has_shape(pyarrow.types, column_type, name):
                raise InputError(f"{path}: column '{name}' is {column_type}, not {wanted}")
    return parquet, pyarrow


def _has_shape(types: ModuleType, column_type: Any, name: str) -> bool:
    """Whether a column's type gives the Python values a JSONL record would hold there
    (an all-null column is fine: its rows have no such value)."""
    if types.is_null(column_type):
        return True
    if name == "messages":
        return bool(types.is_list(column_type) or types.is_large_list(column_type))
    kinds = ("is_string", "is_large_string", "is_string_view")
    return any(getattr(types, kind, lambda _: False)(column_type) for kind in kinds)


def _pyarrow() -> tuple[ModuleType, ModuleType]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise MissingExtra(f"reading Parquet needs pyarrow: {INSTALL_HINT}") from None
    return pyarrow, pyarrow.parquet
