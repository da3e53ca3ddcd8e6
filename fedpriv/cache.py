"""On-disk cache for tensors that cost no privacy (fixed, data-independent transforms of
the data, e.g. ``fedpriv.features``' scattering coefficients).

Where: ``cache_dir()`` — the ``FEDPRIV_CACHE_DIR`` environment variable if set (``off``
disables caching), else ``$XDG_CACHE_HOME/fedpriv`` or ``~/.cache/fedpriv``. The
environment variable is the single source of truth for processes: a command's
``--cache-dir`` flag should call ``export_cache_dir`` so that its Ray workers inherit it.

What: one file per entry, named by the SHA-256 of the entry's parameters (which include
the input tensor's ``tensor_digest``). A file is a small JSON header — the parameters
again, the payload's dtype, shape and SHA-256 — then the tensor's raw bytes; nothing is
unpickled. ``load_tensor`` checks all of it and raises ``CorruptCacheEntry`` on any
mismatch, so a damaged or foreign file is recomputed, never trusted. ``save_tensor``
writes through ``fedpriv.files.write_bytes_atomic``: a reader (another process computing
the same entry at the same time included) sees a whole file or none.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedpriv.files import write_bytes_atomic

CACHE_DIR_ENV = "FEDPRIV_CACHE_DIR"
DISABLED = frozenset({"off", "none", "false", "no", "0"})  # FEDPRIV_CACHE_DIR values (any case)

_MAGIC = b"FEDPRIVT"  # fedpriv tensor cache file
_FORMAT = 1
_ALIGN = 64  # the payload starts at a multiple of 64 bytes
_CHUNK = 1 << 26  # hash in 64 MiB pieces
_READ = 1 << 20  # read and hash in 1 MiB pieces

CacheDir = str | os.PathLike[str] | bool | None


class CorruptCacheEntry(ValueError):
    """A cache file that is truncated, damaged, or not the entry its name says."""


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedpriv``, or ``~/.cache/fedpriv`` when that is unset."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedpriv"


def _parse(value: str | os.PathLike[str]) -> Path | None:
    text = os.fspath(value)
    return None if text.strip().lower() in DISABLED else Path(text).expanduser()


def cache_dir(explicit: CacheDir = None) -> Path | None:
    """The cache's root folder, or None when caching is disabled.

    ``explicit``: None or True → ``$FEDPRIV_CACHE_DIR`` if set and non-empty (``off``,
    ``none``, ``false``, ``no`` or ``0`` → disabled), else ``user_cache_dir()``; False →
    disabled; a path → that folder (the strings above disable it too).
    """
    if explicit is False:
        return None
    if explicit is None or explicit is True:
        env = os.environ.get(CACHE_DIR_ENV, "")
        return _parse(env) if env.strip() else user_cache_dir()
    return _parse(explicit)


def export_cache_dir(value: str | os.PathLike[str] | bool) -> Path | None:
    """Set ``FEDPRIV_CACHE_DIR`` for this process and the ones it starts (Ray workers
    included): an absolute path (workers may run in another folder), or ``off`` for
    False / ``off``. Returns ``cache_dir()`` afterwards."""
    folder = None if value is False else _parse(value if value is not True else user_cache_dir())
    os.environ[CACHE_DIR_ENV] = "off" if folder is None else str(folder.resolve())
    return cache_dir()


def _cpu_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order (a view where it already is a contiguous CPU tensor)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and values (its bytes in C order, whatever its
    device, strides or the files it came from)."""
    h = hashlib.sha256(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    data = _cpu_bytes(tensor)
    for start in range(0, len(data), _CHUNK):
        h.update(data[start : start + _CHUNK])
    return h.hexdigest()


def params_key(params: Mapping[str, Any]) -> str:
    """SHA-256 of the parameters as canonical JSON (sorted keys)."""
    return hashlib.sha256(_canonical(params).encode()).hexdigest()


def _canonical(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def entry_path(folder: str | os.PathLike[str], prefix: str, params: Mapping[str, Any]) -> Path:
    """``folder/<prefix>-<params_key(params)>.tensor``."""
    return Path(folder) / f"{prefix}-{params_key(params)}.tensor"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptCacheEntry(f"unknown dtype {name!r}")
    return dtype


def save_tensor(path: str | os.PathLike[str], tensor: torch.Tensor, params: Mapping[str, Any]) -> None:
    """Write ``tensor`` (any device; stored from CPU) and ``params`` to ``path`` atomically."""

    def header(digest: str) -> bytes:
        return json.dumps({
            "format": _FORMAT,
            "params": json.loads(_canonical(params)),
            "dtype": str(tensor.dtype),
            "shape": list(tensor.shape),
            "nbytes": nbytes,
            "sha256": digest,
        }, sort_keys=True).encode()

    nbytes = tensor.nelement() * tensor.element_size()
    length = len(header("0" * 64))  # a hex SHA-256 always has 64 digits
    start = _aligned(length)
    # One buffer, one write (write_bytes_atomic takes the whole file at once); the tensor is
    # copied straight into it, from whatever device it is on.
    buffer = np.empty(start + nbytes, dtype=np.uint8)
    payload = buffer[start:].data
    if nbytes:
        torch.from_numpy(buffer[start:]).view(tensor.dtype).copy_(tensor.detach().reshape(-1))
    text = header(hashlib.sha256(payload).hexdigest())
    assert len(text) == length
    buffer[: len(_MAGIC)] = np.frombuffer(_MAGIC, dtype=np.uint8)
    buffer[len(_MAGIC) : len(_MAGIC) + 8] = np.frombuffer(struct.pack("<Q", length), dtype=np.uint8)
    buffer[len(_MAGIC) + 8 : start] = np.frombuffer(text.ljust(start - len(_MAGIC) - 8), dtype=np.uint8)
    write_bytes_atomic(path, buffer.data)


def _aligned(header_length: int) -> int:
    """Where the payload starts: after magic, length and header, at a multiple of _ALIGN."""
    return -(-(len(_MAGIC) + 8 + header_length) // _ALIGN) * _ALIGN


def load_tensor(path: str | os.PathLike[str], params: Mapping[str, Any]) -> torch.Tensor | None:
    """The CPU tensor stored at ``path`` for ``params``; None if there is no such file.

    Raises ``CorruptCacheEntry`` when the file is truncated, longer than its header says,
    fails its checksum, or was stored for other parameters; ``OSError`` when it cannot
    be read.
    """
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115
    except FileNotFoundError:
        return None
    with f:
        length, dtype, shape, nbytes, digest = _read_header(f, params)
        if os.fstat(f.fileno()).st_size != _aligned(length) + nbytes:
            raise CorruptCacheEntry(f"{os.fstat(f.fileno()).st_size} bytes, expected {_aligned(length) + nbytes}")
        out = torch.empty(shape, dtype=dtype)
        f.seek(_aligned(length))
        view, h, got = _cpu_bytes(out), hashlib.sha256(), 0
        while got < nbytes:  # hash each piece while it is still in the CPU's cache
            n = f.readinto(view[got : got + _READ])
            if not n:
                raise CorruptCacheEntry(f"truncated: {got} of {nbytes} bytes")
            h.update(view[got : got + n])
            got += n
        if f.read(1):
            raise CorruptCacheEntry("longer than its header says")
    if h.hexdigest() != digest:
        raise CorruptCacheEntry("checksum mismatch")
    return out


def _read_header(f: io.FileIO, params: Mapping[str, Any]) -> tuple[int, torch.dtype, tuple[int, ...], int, str]:
    """(header length, dtype, shape, payload bytes, SHA-256) from an open cache file,
    checked against ``params``; ``CorruptCacheEntry`` for anything inconsistent."""
    head = f.read(len(_MAGIC) + 8)
    if len(head) < len(_MAGIC) + 8 or head[: len(_MAGIC)] != _MAGIC:
        raise CorruptCacheEntry("not a fedpriv tensor cache file")
    (length,) = struct.unpack("<Q", head[len(_MAGIC) :])
    if length > 1 << 20:
        raise CorruptCacheEntry(f"header of {length} bytes")
    try:
        header = json.loads(f.read(length))
        dtype, shape = _dtype(header["dtype"]), tuple(int(n) for n in header["shape"])
        nbytes, digest = int(header["nbytes"]), str(header["sha256"])
        stored, fmt = header["params"], header["format"]
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptCacheEntry(f"unreadable header: {err}") from err
    if fmt != _FORMAT:
        raise CorruptCacheEntry(f"format {fmt!r}, expected {_FORMAT}")
    if stored != json.loads(_canonical(params)):
        raise CorruptCacheEntry("stored for other parameters")
    if min(shape, default=0) < 0 or math.prod(shape) * dtype.itemsize != nbytes:
        raise CorruptCacheEntry(f"header says {nbytes} bytes for {shape} {dtype}")
    return length, dtype, shape, nbytes, digest
