"""Distributed DP-SGD's node side: the integer lattice, conditional rounding, discrete
Gaussian noise shares, and one node's contribution to a step (docs/distributed.md)."""

from fedpriv.distributed.contribution import Contribution, decode_sum, distributed_contribution, unflatten
from fedpriv.distributed.lattice import Lattice, check_headroom, fine_scale
from fedpriv.distributed.noise import discrete_gaussian
from fedpriv.distributed.rounding import conditional_round

__all__ = [
    "Contribution",
    "Lattice",
    "check_headroom",
    "conditional_round",
    "decode_sum",
    "discrete_gaussian",
    "distributed_contribution",
    "fine_scale",
    "unflatten",
]
