"""Fixed input features: the 2-D wavelet scattering transform (Mallat 2012).

Tramèr & Boneh 2021 ("Differentially Private Learning Needs Better Features") show that
DP-SGD on scattering coefficients beats end-to-end CNNs at small ε: the features are
good, so the private model can be small, and few parameters mean little noise. The
transform is a fixed cascade of Morlet wavelet convolutions, moduli and a low-pass
filter; it depends on no data, so computing it costs no privacy.

``scattering_features`` uses J = 2 scales and 8 angles (81 coefficients per input
channel, on a grid 4× coarser), computed by Kymatio's PyTorch backend on the images'
device. (Kymatio has a per-call overhead, hence large batches.)

``cached_scattering_features`` is what ``fedpriv.models.model_inputs`` uses: the same
tensor, stored on disk (``fedpriv.cache``) under a key made of the images' content
(``tensor_digest``: dtype, shape, values) and everything the result depends on (J, L,
image size, dtype, device kind, batch size, Kymatio and PyTorch versions,
``FEATURES_VERSION``), so a hit is bitwise what the computation would return. MNIST's
70,000 images take minutes to transform on a CPU and a second or two to load.
"""

from __future__ import annotations

import functools
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from fedpriv import cache

SCALES = 2
ANGLES = 8
COEFFICIENTS = 1 + SCALES * ANGLES + ANGLES**2 * SCALES * (SCALES - 1) // 2  # 81 per channel

# Bump when the transform's code changes what it computes: old cache entries are then ignored.
FEATURES_VERSION = 1
FEATURES_FOLDER = "features"  # under fedpriv.cache.cache_dir()

log = logging.getLogger(__name__)


@functools.cache
def _scattering(height: int, width: int, device: torch.device) -> torch.nn.Module:
    # Import the 2-D frontend directly: ``kymatio.torch`` also loads the 3-D transform,
    # which needs ``scipy.special.sph_harm`` (removed in SciPy 1.17).
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    return ScatteringTorch2D(J=SCALES, shape=(height, width), L=ANGLES).to(device)


@torch.no_grad()
def scattering_features(
    images: torch.Tensor, batch_size: int = 2048, progress: bool | None = False
) -> torch.Tensor:
    """(N, C, H, W) images → (N, 81·C, H/4, W/4) scattering coefficients, on their device.

    Each image's coefficients depend on that image only (not on the batch), so the
    features of a subset equal the subset of the features. ``progress``: a tqdm bar over
    batches (None: only when stderr is a terminal).
    """
    _check(images)
    n, channels, height, width = images.shape
    scattering = _scattering(height, width, images.device)
    shape = scattering_shape((channels, height, width))
    out = torch.empty((n, *shape), dtype=images.dtype, device=images.device)
    bar = tqdm(range(0, n, batch_size), desc="scattering features", unit="batch", leave=False,
               disable=None if progress is None else not progress)
    for start in bar:
        batch = images[start : start + batch_size]
        out[start : start + len(batch)] = scattering(batch.contiguous()).reshape(len(batch), *shape)
    return out


def scattering_shape(image_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(C, H, W) → (81·C, H/4, W/4): the shape of one image's scattering coefficients."""
    channels, height, width = image_shape
    return channels * COEFFICIENTS, height // 2**SCALES, width // 2**SCALES


def _check(images: torch.Tensor) -> None:
    if images.dim() != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got {tuple(images.shape)}")
    height, width = images.shape[-2:]
    if height % 2**SCALES or width % 2**SCALES:
        raise ValueError(f"image height and width must be multiples of {2**SCALES}, got {height}×{width}")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _device_kind(device: torch.device) -> str:
    """Floating-point results may differ between devices, so they are cached apart."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def scattering_cache_params(images: torch.Tensor, batch_size: int = 2048) -> dict[str, Any]:
    """Everything ``scattering_features(images)`` depends on: the cache key's contents."""
    _check(images)
    return {
        "transform": "kymatio.Scattering2D",
        "features_version": FEATURES_VERSION,
        "J": SCALES,
        "L": ANGLES,
        "shape": list(images.shape[-2:]),
        "dtype": str(images.dtype),
        "device": _device_kind(images.device),
        "batch_size": batch_size,
        "kymatio": _version("kymatio"),
        "torch": torch.__version__,
        "byteorder": sys.byteorder,
        "images": cache.tensor_digest(images),
    }


def scattering_cache_path(images: torch.Tensor, cache_dir: cache.CacheDir = None,
                          batch_size: int = 2048) -> Path | None:
    """The file that holds (or would hold) ``images``' features; None if caching is off."""
    root = cache.cache_dir(cache_dir)
    if root is None:
        return None
    return cache.entry_path(root / FEATURES_FOLDER, "scattering", scattering_cache_params(images, batch_size))


def _announce(message: str, loud: bool) -> None:
    """Log ``message``; when ``loud`` and logging would not show it, print it to stderr."""
    if not loud:
        log.debug(message)
    elif log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(message)
    else:
        print(message, file=sys.stderr, flush=True)


def cached_scattering_features(
    images: torch.Tensor,
    cache_dir: cache.CacheDir = None,
    batch_size: int = 2048,
    progress: bool | None = None,
) -> torch.Tensor:
    """``scattering_features(images, batch_size)``, stored in / loaded from the cache.

    ``cache_dir``: see ``fedpriv.cache.cache_dir`` (None: ``$FEDPRIV_CACHE_DIR`` or the
    user's cache folder; False or "off": no cache). A hit is bitwise equal to the
    computation and on the images' device. A missing, unreadable or corrupt entry is
    computed and (over)written; a failed write is logged, not raised. A computation of at
    least ``batch_size`` images says so on stderr (or the log) and shows a progress bar
    when stderr is a terminal (``progress`` None; True / False force it).
    """
    _check(images)
    root = cache.cache_dir(cache_dir)
    n = len(images)
    if root is None:
        _announce(f"computing scattering features for {n} images (cache disabled)", n >= batch_size)
        return scattering_features(images, batch_size, progress)
    params = scattering_cache_params(images, batch_size)
    path = cache.entry_path(root / FEATURES_FOLDER, "scattering", params)
    try:
        hit = cache.load_tensor(path, params)
    except (cache.CorruptCacheEntry, OSError) as err:
        log.warning("ignoring scattering features cache entry %s: %s", path, err)
        hit = None
    if hit is not None:
        log.debug("loaded scattering features for %d images from %s", n, path)
        return hit.to(images.device)
    _announce(f"computing scattering features for {n} images (cached in {path})", n >= batch_size)
    features = scattering_features(images, batch_size, progress)
    try:
        cache.save_tensor(path, features, params)
    except OSError as err:
        log.warning("could not cache scattering features in %s: %s", path, err)
    return features
