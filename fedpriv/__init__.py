"""fedpriv: federated learning with differential privacy, built on Flower."""

__version__ = "0.1.0"
