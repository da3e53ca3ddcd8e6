"""Fixed input features: the 2-D wavelet scattering transform (Mallat 2012).

Tramèr & Boneh 2021 ("Differentially Private Learning Needs Better Features") show that
DP-SGD on scattering coefficients beats end-to-end CNNs at small ε: the features are
good, so the private model can be small, and few parameters mean little noise. The
transform is a fixed cascade of Morlet wavelet convolutions, moduli and a low-pass
filter; it depends on no data, so computing it costs no privacy.

``scattering_features`` uses J = 2 scales and 8 angles (81 coefficients per input
channel, on a grid 4× coarser), computed by Kymatio's PyTorch backend on the images'
device. (Kymatio has a per-call overhead, hence large batches.)
"""

from __future__ import annotations

import functools
import logging

import torch
from tqdm.auto import tqdm

SCALES = 2
ANGLES = 8
COEFFICIENTS = 1 + SCALES * ANGLES + ANGLES**2 * SCALES * (SCALES - 1) // 2  # 81 per channel

log = logging.getLogger(__name__)


@functools.cache
def _scattering(height: int, width: int, device: torch.device) -> torch.nn.Module:
    # Import the 2-D frontend directly: ``kymatio.torch`` also loads the 3-D transform,
    # which needs ``scipy.special.sph_harm`` (removed in SciPy 1.17).
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    return ScatteringTorch2D(J=SCALES, shape=(height, width), L=ANGLES).to(device)


@torch.no_grad()
def scattering_features(images: torch.Tensor, batch_size: int = 2048, progress: bool = False) -> torch.Tensor:
    """(N, C, H, W) images → (N, 81·C, H/4, W/4) scattering coefficients, on their device.

    Each image's coefficients depend on that image only (not on the batch), so the
    features of a subset equal the subset of the features.
    """
    if images.dim() != 4:
        raise ValueError(f"expected images of shape (N, C, H, W), got {tuple(images.shape)}")
    n, channels, height, width = images.shape
    if height % 2**SCALES or width % 2**SCALES:
        raise ValueError(f"image height and width must be multiples of {2**SCALES}, got {height}×{width}")
    scattering = _scattering(height, width, images.device)
    shape = (channels * COEFFICIENTS, height // 2**SCALES, width // 2**SCALES)
    out = torch.empty((n, *shape), dtype=images.dtype, device=images.device)
    if n > 10 * batch_size:
        log.info("computing scattering features of %d images", n)
    for start in tqdm(range(0, n, batch_size), desc="scattering", disable=not progress, leave=False):
        batch = images[start : start + batch_size]
        out[start : start + len(batch)] = scattering(batch.contiguous()).reshape(len(batch), *shape)
    return out
