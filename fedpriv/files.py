"""Crash-safe file output: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes | memoryview, temp_prefix: str | None = None) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder (named ``temp_prefix``,
    default ``.<name>.``, + random + ``.tmp``), fsync and ``os.replace``; on any failure the
    temp file is removed and the old file is intact (a killed process leaves it behind)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix or f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any, indent: int = 2) -> None:
    """``data`` as JSON, written with ``write_bytes_atomic``."""
    write_bytes_atomic(path, json.dumps(data, indent=indent).encode("utf-8"))
