"""Federated DP-SGD on CIFAR-10: ``python -m simulations.cifar --clients 10 --target-epsilon 8``.

Same flags as ``simulations.mnist``; pass ``--download`` the first time (or ``--data-dir``).
"""

from simulations._command import entry_point

build_parser, main = entry_point("cifar10")

if __name__ == "__main__":
    main()
