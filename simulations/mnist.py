"""Federated DP-SGD on MNIST: ``python -m simulations.mnist --clients 10 --target-epsilon 2``.

Runs the project's ClientApp and ServerApp with Flower's Ray simulation engine; see
``python -m simulations.mnist --help`` and docs/federated.md.
"""

from simulations._command import entry_point

build_parser, main = entry_point("mnist")

if __name__ == "__main__":
    main()
