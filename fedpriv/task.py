"""A user's own model and data: the task contract, in Flower's vocabulary (docs/own-task.md).

A task is a Python module of the user's app (the run-config key ``task``, e.g. ``"task"``
for ``task.py``) that defines

- ``model() -> torch.nn.Module``;
- ``load_data(partition_id, num_partitions, data_dir) -> (train, test)``: map-style data
  sets (``torch.utils.data.Dataset``, or anything with ``__len__`` and ``__getitem__``)
  whose items are ``(x, y)``: ``x`` a tensor, ``y`` an integer class (or a tensor);
- optionally ``loss(outputs, targets)`` (the mean loss of a batch; default cross-entropy)
  and ``metrics(outputs, targets) -> dict`` (the server reports its ``"accuracy"``).

One record, the unit of the node's DP guarantee, is one item of the train set. Everything
here is checked before anything is booked or started (``check_task``); each failure is one
``TaskError`` line naming the app, the function and what was expected. ``data_dir`` is
always the caller's own folder: a node's policy's, never one the server names.

A ``TensorDataset`` of (x, y) is taken as it is (the fast path); any other train set is
read once to check its items, then the DP-SGD engine draws its Poisson lots as indices
and fetches only those items (``fedpriv.dpsgd.items``), so it need not fit in memory; a
test set is read into memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import math
import sys
import sysconfig
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedpriv.data import TensorPair
from fedpriv.dpsgd.items import ItemFeatures
from fedpriv.dpsgd.modules import UnsupportedModuleError, check_model
from fedpriv.dpsgd.per_example import LossFn
from fedpriv.dpsgd.recurrent import fix_recurrent
from fedpriv.dpsgd.validate import validate_model
from fedpriv.model_names import TASK_MODEL
from fedpriv.models import build_model
from fedpriv.seeding import derive_seed

REQUIRED = ("model", "load_data")
OPTIONAL = ("loss", "metrics")
Metrics = Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]]

_PARTITION_KEY: contextvars.ContextVar[int] = contextvars.ContextVar("fedpriv_partition_key", default=0)


class TaskError(ValueError):
    """A user's task breaks its contract: one line naming the app, the function and what was
    expected. ``public`` is the same without anything the user's own code said (which could
    hold a node's paths or data): what a node tells a server."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(f"{message}: {detail}" if detail else message)
        self.public = message


@dataclass(frozen=True)
class Task:
    """A loaded task module (``load_task``): its functions, and how errors name it."""

    app: str
    name: str
    module: ModuleType

    @property
    def loss(self) -> LossFn:
        return getattr(self.module, "loss", None) or F.cross_entropy

    @property
    def metrics(self) -> Metrics | None:
        return getattr(self.module, "metrics", None)

    def where(self, function: str) -> str:
        return f"app {self.app}: {self.name}.{function}"

    def build_model(self, seed: int) -> nn.Module:
        """``model()``, initialised from ``derive_seed(seed, "model")`` (as ``fedpriv.models``
        builds its own; the caller's random state is left untouched), its GRU and RNN layers
        in a form vmap can differentiate per example (``fedpriv.dpsgd.recurrent``)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "model"))
            model = _call(self, "model")
        if not isinstance(model, nn.Module):
            raise TaskError(f"{self.where('model')}() must return a torch.nn.Module, got {type(model).__name__}")
        if not any(p.requires_grad for p in model.parameters()):
            raise TaskError(f"{self.where('model')}() returned a model without trainable parameters")
        return fix_recurrent(model)

    def load(self, partition_id: int, num_partitions: int, data_dir: Path,
             partition_key: int = 0) -> tuple[TensorPair, TensorPair]:
        """(train, test) of ``load_data(partition_id, num_partitions, data_dir)`` as tensors,
        every item checked (``as_tensors``; the train set's features fetched lot by lot unless
        it is a ``TensorDataset``); ``partition_key``: the node policy's, read by ``keyed_share``."""
        token = _PARTITION_KEY.set(partition_key)
        try:
            result = _call(self, "load_data", partition_id, num_partitions, Path(data_dir))
        finally:
            _PARTITION_KEY.reset(token)
        where = self.where("load_data")
        if not (isinstance(result, tuple | list) and len(result) == 2):
            raise TaskError(f"{where} must return (train, test), two data sets; got {_kind(result)}")
        train = as_tensors(result[0], f"{where}'s train set", lazy=True)  # lots fetch their items
        test = as_tensors(result[1], f"{where}'s test set")
        if train.features.shape[1:] != test.features.shape[1:] or train.labels.shape[1:] != test.labels.shape[1:]:
            raise TaskError(f"{where}'s train and test items must have one shape; got x {_shape(train.features)} "
                            f"and {_shape(test.features)}")
        return train, test


def load_task(name: str, app_dir: str | Path | None = None) -> Task:
    """The task module ``name``: from ``app_dir`` (``<app_dir>/<name>.py``, loaded apart from
    any other app's module of that name), or imported by name from ``sys.path`` (where
    Flower puts an app's folder); ``TaskError`` if it does not import or lacks a function."""
    return _load_task(name, None if app_dir is None else str(Path(app_dir).resolve()))


@functools.lru_cache(maxsize=8)
def _load_task(name: str, app_dir: str | None) -> Task:
    app = Path(app_dir).name if app_dir else name
    if not name.isidentifier():
        raise TaskError(f"app {app}: task must name a Python module (e.g. \"task\" for task.py), got {name!r}")
    try:
        module = _import(name, app_dir)
    except Exception as err:  # the user's code: any error is theirs to see, in one line
        raise TaskError(f"app {app}: task module {name!r} does not import", _said(err)) from err
    task = Task(Path(module.__file__).parent.name if app_dir is None and module.__file__ else app, name, module)
    for function in REQUIRED:
        if not callable(getattr(module, function, None)):
            raise TaskError(f"{task.where(function)} is missing: the task module must define {_SIGNATURES[function]}")
    for function in OPTIONAL:
        if getattr(module, function, None) is not None and not callable(getattr(module, function)):
            raise TaskError(f"{task.where(function)} must be a function {_SIGNATURES[function]}")
    return task


_SIGNATURES = {
    "model": "model() -> torch.nn.Module",
    "load_data": "load_data(partition_id, num_partitions, data_dir) -> (train, test)",
    "loss": "loss(outputs, targets) -> the mean loss of the batch",
    "metrics": "metrics(outputs, targets) -> {name: value}",
}


def _import(name: str, app_dir: str | None) -> ModuleType:
    if app_dir is None:
        _check_app_module(name)
        return importlib.import_module(name)
    path = Path(app_dir) / f"{name}.py"
    if not path.is_file():
        raise ModuleNotFoundError(f"no {path.name} in the app's folder")
    unique = f"_fedpriv_task_{abs(hash(str(path)))}_{name}"
    spec = importlib.util.spec_from_file_location(unique, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(unique, None)
        raise
    return module


def _check_app_module(name: str) -> None:
    """``ImportError`` unless ``name`` is a module of an app's own folder: the run config that
    names it is the server's, so a module of Python's installation (the standard library,
    site-packages, a built-in) is refused before it is imported (importing runs its code)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"no module named {name!r} in the app's folder")
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    origin = Path(spec.origin).resolve() if spec.origin and spec.has_location else None
    if origin is None or any(origin.is_relative_to(folder) for folder in installed):
        raise ImportError(f"{name!r} is not a module of the app (it is part of the Python installation)")


def as_tensors(data: Any, what: str, lazy: bool = False) -> TensorPair:
    """A map-style data set of (x, y) items as (features, labels) tensors, every item checked:
    a tensor ``x`` of one shape, a ``y`` that is an integer (int64 labels) or a tensor of one
    shape; at least one item. A ``TensorDataset`` of two tensors is taken as it is (the fast
    path). Any other data set is read once, item by item; its x are stacked, or with ``lazy``
    left in it: the features are ``ItemFeatures``, which fetch a lot's items when indexed
    (``fedpriv.dpsgd.items``), so the data set need not fit in memory (its labels are held)."""
    tensors = getattr(data, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) == 2 and all(isinstance(t, torch.Tensor) for t in tensors):
        features, labels = tensors
        if features.is_floating_point() and not bool(features.isfinite().all()):
            raise TaskError(f"{what}: x holds a NaN or infinite value")
    else:
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TaskError(f"{what} must be a map-style data set (__len__ and __getitem__), got {_kind(data)}")
        features, labels = _read_items(data, what, lazy)
    if len(features) != len(labels) or len(features) == 0:
        raise TaskError(f"{what} must hold at least one (x, y) item and as many y as x; got {len(features)} x, "
                        f"{len(labels)} y")
    if not (features.dtype.is_floating_point or features.dtype in _INTEGERS):
        raise TaskError(f"{what}: x must be a float or integer tensor, got {features.dtype}")
    if not (labels.is_floating_point() or labels.dtype in _INTEGERS):
        raise TaskError(f"{what}: y must be an integer class (or a float tensor), got {labels.dtype}")
    return TensorPair(features, labels.long() if labels.dtype in _INTEGERS else labels)


_INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _read_items(data: Any, what: str, lazy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Every item of ``data`` read once and checked (a pair, one shape, a finite x); the
    stacked (x, y), or with ``lazy`` (``ItemFeatures``, y): no x is kept."""
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    xs, ys = [], []
    for i in range(len(data)):
        x, y = _item(data[i], i, what)
        if first is None:
            first = x, y
        elif x.shape != first[0].shape or x.dtype != first[0].dtype or y.shape != first[1].shape:
            raise TaskError(f"{what}: item {i} is x {_shape(x)}, y {_shape(y)}; item 0 was x {_shape(first[0])}, "
                            f"y {_shape(first[1])}: every item must have one shape")
        if x.is_floating_point() and not bool(x.isfinite().all()):
            raise TaskError(f"{what}: item {i}'s x holds a NaN or infinite value")
        ys.append(y)
        if not lazy:
            xs.append(x)
    if first is None:
        raise TaskError(f"{what} is empty: a data set holds at least one (x, y) item")
    labels = torch.stack(ys)
    if not lazy:
        return torch.stack(xs), labels
    items = ItemFeatures(data, torch.Size((len(ys), *first[0].shape)), first[0].dtype,
                         lambda x, i: _x(x, i, what))
    return cast(torch.Tensor, items), labels  # it stands in for the tensor (fedpriv.dpsgd.items)


def _x(x: Any, index: int, what: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TaskError(f"{what}: item {index}'s x must be a tensor (or a NumPy array), got {_kind(x)}")
    return x


def _item(item: Any, index: int, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise TaskError(f"{what}: item {index} must be a pair (x, y), got {_kind(item)}")
    x, y = item
    if isinstance(y, bool) or not isinstance(y, int | float | np.integer | np.floating | torch.Tensor | np.ndarray):
        raise TaskError(f"{what}: item {index}'s y must be an integer class or a tensor, got {_kind(y)}")
    return _x(x, index, what), torch.as_tensor(y)


def check_task(task: Task, data_dir: Path, seed: int = 0, num_partitions: int = 1,
               partition_key: int = 0) -> list[int]:
    """Everything that can fail before a run, checked on each of ``num_partitions`` shares:
    ``load_data``'s data sets and items, ``model()``, the model's output on one example
    against ``loss``, and that the model keeps examples apart (``fedpriv.dpsgd.validate``).
    Returns each share's number of training records (what the simulations' operator knows)."""
    model = task.build_model(seed)
    sizes = []
    for partition_id in range(num_partitions):
        train, _ = task.load(partition_id, num_partitions, data_dir, partition_key)
        sizes.append(len(train.labels))
    whole, test = task.load(0, 1, data_dir, partition_key)
    check_model_fits(task, model, whole)
    check_model_fits(task, model, test)
    return sizes


def check_model_fits(task: Task, model: nn.Module, data: TensorPair) -> None:
    """``model``'s output on one example fits ``loss`` (a finite scalar with a gradient), and,
    with two examples, the model does not mix them (``UnsupportedModuleError`` as ``TaskError``)."""
    x, y = data.features[:1], data.labels[:1]
    try:
        check_model(model)  # a known batch-mixing layer first: BatchNorm cannot even take one example
        output = model(x)
    except UnsupportedModuleError as err:
        raise TaskError(f"{task.where('model')}(): {err}") from err
    except Exception as err:
        raise TaskError(f"{task.where('model')}() cannot take a batch of one x {_shape(x)} from load_data",
                        _said(err)) from err
    try:
        value = task.loss(output, y)
    except Exception as err:
        raise TaskError(f"{task.where('loss')} does not fit the model: outputs {_shape(output)} against targets "
                        f"{_shape(y)} (cross-entropy expects (B, classes) logits and (B,) integer classes)",
                        _said(err)) from err
    if not (isinstance(value, torch.Tensor) and value.dim() == 0 and value.requires_grad
            and math.isfinite(float(value.detach()))):
        raise TaskError(f"{task.where('loss')} must return the batch's mean loss, a finite scalar tensor with a "
                        f"gradient; got {_kind(value)}")
    if len(data.labels) >= 2:
        try:
            validate_model(model, data.features[0], data.features[1])
        except UnsupportedModuleError as err:
            raise TaskError(f"{task.where('model')}(): {err}") from err


@torch.no_grad()
def evaluate_task(task: Task, model: nn.Module, data: TensorPair, batch_size: int = 1024) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on ``data``: the task's ``loss``, and its metrics'
    ``"accuracy"`` where it defines ``metrics``, else ``argmax_correct``'s (the rule of the
    nodes' noisy evaluation)."""
    model.eval()
    device = next(model.parameters()).device
    outputs = torch.cat([model(data.features[i:i + batch_size].to(device))
                         for i in range(0, len(data.labels), batch_size)])
    labels = data.labels.to(device)
    loss = float(task.loss(outputs, labels))
    if task.metrics is not None:
        return loss, float(_call(task, "metrics", outputs, labels).get("accuracy", math.nan))
    return loss, float(argmax_correct(outputs, labels).double().mean())


def argmax_correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each record's correctness for a task without ``metrics``: its argmax is its class,
    where the targets are integer classes of (B, classes) outputs; else none is correct (a
    regression's float targets have no argmax to match: define ``metrics`` for its accuracy)."""
    if outputs.dim() == 2 and targets.dim() == 1 and not targets.is_floating_point():
        return outputs.argmax(dim=1) == targets
    return torch.zeros(len(targets), dtype=torch.bool, device=outputs.device)


def partition_key() -> int:
    """The partition key of the node whose ``load_data`` is running (its policy's
    ``partition-key``; 0 outside a node): what ``keyed_share`` splits by."""
    return _PARTITION_KEY.get()


def keyed_share(data: Any, partition_id: int, num_partitions: int) -> torch.utils.data.TensorDataset:
    """Share ``partition_id`` of ``num_partitions`` of the map-style data set ``data`` (its items
    read as ``as_tensors`` reads them) under fedpriv's keyed per-record rule
    (``fedpriv.federation.partition``, iid) and this node's ``partition_key()``: a record's share
    depends on its own bytes and the key alone, so shares do not move when other records
    are added to or removed from the files."""
    from fedpriv.federation.partition import Split
    from fedpriv.federation.settings import Partition

    whole = as_tensors(data, "keyed_share's data set")
    split = Split(whole.features, whole.labels, Partition.IID, num_partitions, 1.0, partition_key())
    index = torch.from_numpy(split.indices(partition_id).copy())
    return torch.utils.data.TensorDataset(whole.features[index], whole.labels[index])


def run_model(name: str, seed: int, task: str | None) -> nn.Module:
    """The model a plan names, initialised from ``seed``: the run's task's ``model()`` for
    ``TASK_MODEL`` (``task``: the run config's, imported by name), else ``fedpriv.models``'.
    A plan and a run that disagree about the task is a ``ValueError``."""
    if (name == TASK_MODEL) != (task is not None):
        raise ValueError(f"the plan's model {name!r} does not fit the run's task {task!r}: a task run's plan names "
                         f"{TASK_MODEL!r}")
    return build_model(name, seed) if task is None else load_task(task).build_model(seed)


@contextlib.contextmanager
def _user_code(task: Task, function: str) -> Iterator[None]:
    try:
        yield
    except TaskError:
        raise
    except Exception as err:
        raise TaskError(f"{task.where(function)} failed", _said(err)) from err


def _call(task: Task, function: str, *args: Any) -> Any:
    with _user_code(task, function):
        return getattr(task.module, function)(*args)


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _kind(value: Any) -> str:
    return f"a tensor {_shape(value)}" if isinstance(value, torch.Tensor) else type(value).__name__


def _shape(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
