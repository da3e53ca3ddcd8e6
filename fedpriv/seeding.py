"""Reproducible randomness: every stream is derived from one user seed and a path of keys.

Each purpose gets its own stream so that, e.g., DP noise never shares a generator with
data shuffling, and client ``c`` in round ``r`` draws the same numbers however the run is
scheduled. The single-client federated run and the centralized run use the same paths
(client 0, round = epoch), which is what makes them produce identical models.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *path: int | str) -> int:
    """A 63-bit seed for the stream named by ``path`` under the user ``seed``."""
    text = "/".join([str(int(seed)), *map(str, path)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def generator(seed: int, *path: int | str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded for the stream named by ``path``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *path))
    return gen


def round_generators(
    seed: int, client: int, round_: int, device: torch.device | str = "cpu"
) -> tuple[torch.Generator, torch.Generator]:
    """(sampling, noise) generators for one client's local training in one round."""
    return (
        generator(seed, "sampling", client, round_, device=device),
        generator(seed, "noise", client, round_, device=device),
    )
