"""The model zoo's names (``fedpriv.models`` builds them), importable without torch: a
training plan names its model and is checked, planned and calibrated without building it."""

MODELS: tuple[str, ...] = ("mlp", "cnn", "cifar_cnn", "scatter_linear", "scatter_cnn")

TASK_MODEL = "task"
"""The plan's model name in a run of a user's task (``fedpriv.task``): the model is the
task's ``model()``, built by each party from its own copy of the app, never named by a peer."""
