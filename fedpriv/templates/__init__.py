"""The apps ``python -m fedpriv new APP_DIR --template NAME`` writes (``fedpriv.new``).

Each module here is a complete task (``fedpriv.task``'s contract) on data that exists
offline, copied as it is into the app as ``task.py``: ``prepare(data_dir)`` writes its data
once, ``RUN_CONFIG`` its run-config defaults (pyproject.toml), ``FLOOR`` the test accuracy
its tests require (docs/own-task.md).
"""

TEMPLATES = ("tabular", "image", "text")
