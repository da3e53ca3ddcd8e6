"""Model zoo for DP-SGD: no BatchNorm anywhere (it mixes examples, so per-example
gradients — and hence per-example clipping — would be meaningless).

- ``mlp``: the 784–1000–10 ReLU MLP of Abadi et al. 2016 (``in_features`` may be a
  DP-PCA projection's dimension instead of 784).
- ``cnn``: the small tanh CNN for MNIST of Papernot et al. 2020 ("Tempered sigmoid
  activations"), ~26k parameters; bounded activations keep clipped gradients useful.
- ``cifar_cnn``: a tanh CNN with GroupNorm for 3×32×32 inputs (Tramèr & Boneh 2021
  style, GroupNorm in place of BatchNorm).
- ``scatter_linear``: Tramèr & Boneh 2021's ScatterNet+linear: GroupNorm (no affine
  parameters) and one linear layer on the images' scattering coefficients
  (``fedpriv.features``), 39,700 parameters for MNIST. Its inputs are
  ``model_inputs("scatter_linear", images)``, computed once per data set, not per step,
  and cached on disk (``fedpriv.features.cached_scattering_features``).
- ``scatter_cnn``: Tramèr & Boneh 2021's ScatterNet+CNN for MNIST: the same normalised
  scattering coefficients into two tanh 3×3 convolutions (16 channels, stride 2; 32) and
  a 32-unit tanh classifier, 33,066 parameters.

Initialisation is reproducible: ``build_model(name, seed)`` seeds torch's global RNG
with ``derive_seed(seed, "model")`` inside ``torch.random.fork_rng`` so the caller's RNG
state is left untouched.

Memory layout: ``cnn`` is built in ``torch.channels_last`` (``CHANNELS_LAST``), where torch's
CPU max-pool is several times faster than in NCHW (docs/performance.md). Layout never
changes values: state dicts, ``model_sha256`` and the arrays sent over the wire are the
same as an NCHW model's (tested). Its inputs need no conversion: a one-channel image
batch is both NCHW- and channels_last-contiguous, and the first convolution's output
follows the weights' layout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch import nn

from fedpriv.cache import CacheDir
from fedpriv.features import COEFFICIENTS, cached_scattering_features, scattering_shape
from fedpriv.model_names import MODELS
from fedpriv.seeding import derive_seed


def mlp(in_features: int = 784, hidden: int = 1000, num_classes: int = 10) -> nn.Module:
    """Flatten → Linear(in, 1000) → ReLU → Linear(1000, 10)."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def mnist_cnn(num_classes: int = 10) -> nn.Module:
    """Papernot et al. 2020 tanh CNN for 1×28×28 inputs (26,010 parameters)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3),  # 16×14×14
        nn.Tanh(),
        nn.MaxPool2d(2, 1),  # 16×13×13
        nn.Conv2d(16, 32, 4, stride=2),  # 32×5×5
        nn.Tanh(),
        nn.MaxPool2d(2, 1),  # 32×4×4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.Tanh(),
        nn.Linear(32, num_classes),
    )


def cifar_cnn(num_classes: int = 10, groups: int = 16) -> nn.Module:
    """Tanh CNN for 3×32×32 inputs; GroupNorm after every convolution (no BatchNorm)."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(c_in, c_out, 3, padding=1),
            nn.GroupNorm(groups, c_out),
            nn.Tanh(),
            nn.Conv2d(c_out, c_out, 3, padding=1),
            nn.GroupNorm(groups, c_out),
            nn.Tanh(),
            nn.MaxPool2d(2),
        ]

    return nn.Sequential(
        *block(3, 32),  # 32×16×16
        *block(32, 64),  # 64×8×8
        *block(64, 128),  # 128×4×4
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 128),
        nn.Tanh(),
        nn.Linear(128, num_classes),
    )


def scatter_linear(
    channels: int = COEFFICIENTS, size: tuple[int, int] = (7, 7), num_classes: int = 10, groups: int = 27
) -> nn.Module:
    """GroupNorm (per example, no parameters) → Linear on (channels, *size) scattering features."""
    return nn.Sequential(
        nn.GroupNorm(groups, channels, affine=False),
        nn.Flatten(),
        nn.Linear(channels * size[0] * size[1], num_classes),
    )


def scatter_cnn(
    channels: int = COEFFICIENTS, size: tuple[int, int] = (7, 7), num_classes: int = 10, groups: int = 27
) -> nn.Module:
    """GroupNorm (no parameters) → Conv 3×3/2 (16) → tanh → Conv 3×3 (32) → tanh → Linear 32 → tanh → Linear."""
    height, width = (size[0] + 1) // 2, (size[1] + 1) // 2
    return nn.Sequential(
        nn.GroupNorm(groups, channels, affine=False),
        nn.Conv2d(channels, 16, 3, stride=2, padding=1),
        nn.Tanh(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(32 * height * width, 32),
        nn.Tanh(),
        nn.Linear(32, num_classes),
    )


_BUILDERS: dict[str, Callable[..., nn.Module]] = dict(
    zip(MODELS, (mlp, mnist_cnn, cifar_cnn, scatter_linear, scatter_cnn), strict=True)
)

CHANNELS_LAST: frozenset[str] = frozenset({"cnn"})
"""Models built in ``torch.channels_last``. Not ``cifar_cnn``: on CPU, GroupNorm's
channels_last kernels cost what its max-pools gain (measured), and CUDA's GroupNorm runs
NCHW only; not ``scatter_cnn``: no pooling, and its GroupNorm over 81 channels of 7×7 is
slower in channels_last (measured)."""

# Fixed, data-independent transforms from images to a model's inputs (no privacy cost),
# cached on disk: each takes (images, cache_dir=..., progress=...).
_INPUT_TRANSFORMS: dict[str, Callable[..., torch.Tensor]] = {
    "scatter_linear": cached_scattering_features,
    "scatter_cnn": cached_scattering_features,
}


def model_inputs(
    name: str, images: torch.Tensor, *, cache_dir: CacheDir = None, progress: bool | None = None
) -> torch.Tensor:
    """What model ``name`` takes: ``images`` themselves, or their fixed features.

    Features are cached on disk (``cache_dir``: see ``fedpriv.cache.cache_dir``; None:
    ``$FEDPRIV_CACHE_DIR`` or the user's cache folder; False: off). ``progress``: a bar
    while computing them (None: when stderr is a terminal).
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    transform = _INPUT_TRANSFORMS.get(name)
    return images if transform is None else transform(images, cache_dir=cache_dir, progress=progress)


_INPUT_SHAPES: dict[str, Callable[[tuple[int, int, int]], tuple[int, ...]]] = {
    "scatter_linear": scattering_shape,
    "scatter_cnn": scattering_shape,
}


def input_shape(name: str, image_shape: tuple[int, int, int]) -> tuple[int, ...]:
    """The shape of one of model ``name``'s inputs for an image of ``image_shape``
    (what ``model_inputs`` gives per image), without computing any."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    shape = _INPUT_SHAPES.get(name)
    return image_shape if shape is None else shape(image_shape)


def build_model(name: str, seed: int, **kwargs: int) -> nn.Module:
    """Model ``name`` initialised from ``derive_seed(seed, "model")``.

    ``kwargs`` go to the builder (e.g. ``in_features`` for ``mlp``). The global torch
    RNG is forked, so building a model does not change the caller's random state. Models
    in ``CHANNELS_LAST`` come in that memory format.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "model"))
        model = _BUILDERS[name](**kwargs)
    return model.to(memory_format=torch.channels_last) if name in CHANNELS_LAST else model


def model_sha256(model: nn.Module) -> str:
    """SHA-256 of the state dict's tensors as float32 bytes, in state-dict order."""
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
