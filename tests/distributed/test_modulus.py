"""The secure sum's modulus holds what the nodes actually add (issue 37, item 4): a node's
noise share is sized for its own policy's honest shares n (std σ·c/√n, not σ·c/√K), and its
lot for its real N, which a noisy released count ñ can understate. Played through the
server's setup (``server.distributed.setup``) and the nodes' own encoding
(``noised_vector``, ``decode_sum``): the decoded sum must be the integer sum, unwrapped."""

import math

import numpy as np

from fedpriv.distributed.contribution import decode_sum, noised_vector
from fedpriv.distributed.lattice import NOISE_TAIL
from fedpriv.federation.policy import NodePolicy
from fedpriv.federation.settings import RunSettings
from fedpriv.privacy import GaussianEvent
from server.assign import Assigner
from server.discovery import ClientInfo
from server.distributed import setup


def _setup(sigma: float, released: list[int], count_noise: float = 0.0):
    settings = RunSettings.from_run_config({"privacy": "distributed", "model": "cnn", "noise-multiplier": sigma,
                                            "lot-size": 1, "rounds": 1})
    clients = {i: ClientInfo(str(i), n, public=count_noise == 0) for i, n in enumerate(released)}
    assigner = Assigner(settings, clients)
    releases = [(GaussianEvent(count_noise),)] if count_noise else []
    return setup(settings, assigner.plan, assigner(clients), releases)


def test_default_policy_nodes_noise_does_not_wrap_the_sum():
    """K = 40 nodes of the default policy (n = 2 honest shares) add noise of std σ·c·√(K/2):
    σ such that 12·σ·c, what the sum was sized for, fills 90 % of a 40-bit half-range, so
    the real noise reaches 2.7 of its stds there: ~70 of the 26,010 coordinates wrapped."""
    nodes, shares = 40, NodePolicy(epsilon_budget=1.0, state_dir=".").honest_shares
    assert shares == 2
    clip = _setup(1.0, [1] * nodes).lattice.clip
    sigma = 0.9 * 2.0**39 / (NOISE_TAIL * clip)
    lattice = _setup(sigma, [1] * nodes).lattice
    assert lattice.modulus_bits > 40
    rng = np.random.default_rng(0)
    stddev = lattice.noise_stddev(sigma, shares)
    vectors = [noised_vector(np.zeros(lattice.dimension, dtype=np.int64), lattice, stddev, rng) for _ in range(nodes)]
    exact = sum(np.where(v >= lattice.modulus // 2, v.astype(np.int64) - lattice.modulus, v.astype(np.int64))
                for v in vectors)  # each share is far inside one modulus: its own centring is exact
    modular = np.mod(sum(v.astype(object) for v in vectors), lattice.modulus).astype(np.uint64)
    assert np.array_equal(decode_sum(modular, lattice).numpy() * lattice.scale, exact.astype(np.float64))
    assert NOISE_TAIL * sigma * lattice.clip * math.sqrt(nodes) < lattice.modulus // 2  # the worst case, n = 1


def test_a_lot_beyond_the_released_count_does_not_wrap_the_sum():
    """One node released ñ with Gaussian noise σ_N = 20; its real N is ñ + 12·σ_N, every
    example's rounded gradient ⌊Δ₂⌋ on one coordinate. ñ is the most that 32 bits hold
    beside σ = 0.1's noise."""
    count_noise = 20.0
    small = _setup(0.1, [1]).lattice
    released = math.floor((2**31 - 1 - NOISE_TAIL * 0.1 * small.clip) / small.sensitivity)
    delta2 = small.sensitivity
    lattice = _setup(0.1, [released], count_noise).lattice
    lot = released + round(NOISE_TAIL * count_noise)
    total = np.zeros(lattice.dimension, dtype=np.int64)
    total[0] = lot * math.floor(delta2)
    vector = noised_vector(total, lattice, 0.0, None)
    assert decode_sum(vector, lattice)[0].item() * lattice.scale == total[0]
