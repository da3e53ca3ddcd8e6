"""Privacy mechanisms shared by the algorithms: each returns its output and its event."""

from fedpriv.mechanisms.laplace import (
    LATTICE_EXPONENT,
    LaplaceRelease,
    epsilon_of,
    laplace_event,
    laplace_mechanism,
    laplace_scale,
    output_step,
    split_epsilon,
)

__all__ = ["LATTICE_EXPONENT", "LaplaceRelease", "epsilon_of", "laplace_event", "laplace_mechanism", "laplace_scale",
           "output_step", "split_epsilon"]
