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


SIMULATION_RUN_ID = 1
"""The Flower run id of ``python -m simulations.*`` runs (and of ``simulations.centralized``,
which trains as a simulation's single node would)."""


def seeded_training_seed(seed: int, run_id: int, ordinal: int) -> int:
    """The seed of one local training on a node whose policy asks for seeded randomness.

    It mixes the node's own seed with the Flower run id and ``ordinal``, the number of
    entries the node's durable ledger held before this training (``round_generators`` then
    mixes in the client and round). The ledger never repeats an ordinal, so no two trainings
    on one node share a draw, even when a server repeats run ids and rounds.
    """
    return derive_seed(seed, "node-run", run_id, "entry", ordinal)
