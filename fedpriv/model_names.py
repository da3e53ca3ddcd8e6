"""The model zoo's names (``fedpriv.models`` builds them), importable without torch: a
training plan names its model and is checked, planned and calibrated without building it."""

MODELS: tuple[str, ...] = ("mlp", "cnn", "cifar_cnn", "scatter_linear", "scatter_cnn")
