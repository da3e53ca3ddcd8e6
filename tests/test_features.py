"""Scattering features: shape, per-image independence, and wavelet properties that hold
for any correct scattering transform (checked against closed forms, not our own output);
and their on-disk cache (hits, misses, corrupt files, the folder's settings)."""

import math
import os
from pathlib import Path

import pytest
import torch

from fedpriv import cache, features
from fedpriv.features import (
    ANGLES,
    COEFFICIENTS,
    SCALES,
    cached_scattering_features,
    scattering_cache_path,
    scattering_features,
)
from fedpriv.models import model_inputs


def test_coefficient_count_is_the_closed_form() -> None:
    # 1 low-pass + J·L first order + L²·J(J−1)/2 second order (j2 > j1) per channel.
    assert COEFFICIENTS == 1 + SCALES * ANGLES + ANGLES**2 * math.comb(SCALES, 2) == 81
    out = scattering_features(torch.rand(3, 3, 32, 32))
    assert out.shape == (3, 3 * 81, 8, 8)


def test_each_image_independent_of_its_batch() -> None:
    images = torch.rand(50, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    whole = scattering_features(images, batch_size=16)
    assert torch.equal(whole[10:30], scattering_features(images[10:30], batch_size=7))


def test_constant_image_low_pass_only() -> None:
    # Wavelets have zero mean and the low-pass filter has unit mass: a constant image c has
    # zeroth-order coefficients c and (up to padding effects at the border) no wavelet energy.
    c = 0.7
    out = scattering_features(torch.full((1, 1, 28, 28), c))[0]
    assert torch.allclose(out[0], torch.full((7, 7), c), atol=1e-4)
    assert out[1:].abs().max() < 1e-6


def test_wavelet_coefficients_are_moduli_and_linear_in_scale() -> None:
    # Every coefficient after the low-pass is an average of a modulus: non-negative; and the
    # transform is positively homogeneous: S(a·x) = a·S(x) for a > 0.
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    out = scattering_features(x)
    assert (out[:, 1:] >= -1e-6).all()
    assert torch.allclose(scattering_features(2.5 * x), 2.5 * out, rtol=1e-4, atol=1e-5)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="N, C, H, W"):
        scattering_features(torch.zeros(28, 28))
    with pytest.raises(ValueError, match="multiples of 4"):
        scattering_features(torch.zeros(1, 1, 30, 30))


# --- The on-disk cache (fedpriv.cache, cached_scattering_features) ---------------------------


@pytest.fixture(autouse=True)
def _no_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test here caches under its own tmp folder, never the user's real cache."""
    folder = tmp_path / "env-cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def computations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts calls of the real computation (the sizes of the image batches it got)."""
    calls: list[int] = []
    real = features.scattering_features

    def counting(images: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        calls.append(len(images))
        return real(images, *args, **kwargs)

    monkeypatch.setattr(features, "scattering_features", counting)
    return calls


def _images(n: int = 6, seed: int = 0, size: int = 16) -> torch.Tensor:
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed))


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_second_call_hits_and_is_bitwise_the_computation(tmp_path: Path, computations: list[int]) -> None:
    images = _images()
    first = cached_scattering_features(images, cache_dir=tmp_path)
    path = scattering_cache_path(images, tmp_path)
    assert path is not None and path.parent == tmp_path / "features" and path.is_file()
    hit = cached_scattering_features(images, cache_dir=tmp_path)
    assert computations == [6]
    fresh = scattering_features(images)
    assert hit.dtype == fresh.dtype and hit.shape == fresh.shape and hit.device == images.device
    assert _bits(hit) == _bits(fresh) == _bits(first)
    # The key is the content: a copy, a non-contiguous view of equal values, hit as well.
    cached_scattering_features(images.clone(), cache_dir=tmp_path)
    wide = torch.zeros(6, 1, 16, 32)
    wide[..., ::2] = images
    assert torch.equal(wide[..., ::2], images) and not wide[..., ::2].is_contiguous()
    assert _bits(cached_scattering_features(wide[..., ::2], cache_dir=tmp_path)) == _bits(fresh)
    assert computations == [6]
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]  # no temp files left


@pytest.mark.usefixtures("one_torch_thread")  # six transforms of 16×16 images
def test_other_images_or_parameters_miss(tmp_path: Path, computations: list[int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    images = _images()
    cached_scattering_features(images, cache_dir=tmp_path)
    changed = images.clone()
    changed[3, 0, 5, 5] += 1e-3
    cached_scattering_features(changed, cache_dir=tmp_path)  # one pixel differs
    cached_scattering_features(images[:5], cache_dir=tmp_path)  # a subset
    cached_scattering_features(images.reshape(6, 1, 8, 32), cache_dir=tmp_path)  # another shape
    cached_scattering_features(images, cache_dir=tmp_path, batch_size=4)  # another batch size
    cached_scattering_features(images[:5], cache_dir=tmp_path)  # each is a hit now
    assert computations == [6, 6, 5, 6, 6]
    monkeypatch.setattr(features, "FEATURES_VERSION", features.FEATURES_VERSION + 1)
    cached_scattering_features(images, cache_dir=tmp_path)  # the transform's code changed
    assert computations == [6, 6, 5, 6, 6, 6]
    assert len(list((tmp_path / "features").iterdir())) == 6


def test_key_covers_transform_parameters() -> None:
    params = features.scattering_cache_params(_images())
    assert {"J": 2, "L": 8, "shape": [16, 16], "dtype": "torch.float32", "device": "cpu"}.items() <= params.items()
    assert {"kymatio", "torch", "features_version", "images", "batch_size"} <= params.keys()
    assert params["images"] == cache.tensor_digest(_images()) != cache.tensor_digest(_images(seed=1))


@pytest.mark.parametrize("damage", ["truncate", "flip_payload", "garbage", "empty", "other_params"])
def test_corrupt_entry_is_recomputed_and_overwritten(tmp_path: Path, computations: list[int], damage: str) -> None:
    images = _images()
    expected = _bits(cached_scattering_features(images, cache_dir=tmp_path))
    path = scattering_cache_path(images, tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip_payload":
        data[-7] ^= 0x40
    elif damage == "garbage":
        data = bytearray(b"\x80\x04not a cache file" * 3)
    elif damage == "empty":
        data = bytearray()
    else:  # a valid file, but for other images
        other = _images(seed=9)
        cached_scattering_features(other, cache_dir=tmp_path)
        data = bytearray(scattering_cache_path(other, tmp_path).read_bytes())
    path.write_bytes(bytes(data))
    with pytest.raises(cache.CorruptCacheEntry):
        cache.load_tensor(path, features.scattering_cache_params(images))
    assert _bits(cached_scattering_features(images, cache_dir=tmp_path)) == expected  # recomputed
    computed = len(computations)
    assert _bits(cached_scattering_features(images, cache_dir=tmp_path)) == expected  # and rewritten
    assert len(computations) == computed


def test_env_var_is_the_default_folder(_no_user_cache: Path, tmp_path: Path, computations: list[int],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache.cache_dir() == _no_user_cache
    images = _images()
    cached_scattering_features(images)
    model_inputs("scatter_linear", images)
    assert computations == [6]
    assert scattering_cache_path(images).parent == _no_user_cache / "features"
    assert scattering_cache_path(images).is_file()
    # An explicit folder beats the variable; unset or empty variable: the XDG / home default.
    assert cache.cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(cache.CACHE_DIR_ENV, "")
    assert cache.cache_dir() == cache.cache_dir(True) == tmp_path / "xdg" / "fedpriv"
    monkeypatch.delenv(cache.CACHE_DIR_ENV)
    assert cache.cache_dir() == tmp_path / "xdg" / "fedpriv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "fedpriv"


def test_export_sets_an_absolute_path_for_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cache.export_cache_dir("rel/cache") == tmp_path / "rel" / "cache"
    assert os.environ[cache.CACHE_DIR_ENV] == str(tmp_path / "rel" / "cache")
    assert cache.export_cache_dir(False) is None and os.environ[cache.CACHE_DIR_ENV] == "off"


@pytest.mark.parametrize("how", ["env off", "env OFF", "argument False", "argument off"])
def test_disabled_cache_computes_every_time(tmp_path: Path, computations: list[int],
                                            monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv(cache.CACHE_DIR_ENV, how.split()[1] if how.startswith("env") else str(tmp_path))
    kwargs = {"cache_dir": {"argument False": False, "argument off": "off"}[how]} if how.startswith("argument") else {}
    images = _images()
    first = cached_scattering_features(images, **kwargs)
    second = model_inputs("scatter_linear", images, **kwargs)
    assert computations == [6, 6] and torch.equal(first, second)
    assert scattering_cache_path(images, **kwargs) is None
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_unwritable_cache_still_returns_features(tmp_path: Path, computations: list[int]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    images = _images()
    assert torch.equal(cached_scattering_features(images, cache_dir=blocker), scattering_features(images))
    assert computations == [6]


def test_computing_says_so_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images = _images(n=5)
    cached_scattering_features(images, cache_dir=tmp_path, batch_size=2, progress=False)
    path = scattering_cache_path(images, tmp_path, batch_size=2)
    assert f"computing scattering features for 5 images (cached in {path})" in capsys.readouterr().err
    cached_scattering_features(images, cache_dir=tmp_path, batch_size=2, progress=False)
    assert "computing" not in capsys.readouterr().err  # a hit is quiet
    cached_scattering_features(images, cache_dir=False, batch_size=2, progress=False)
    assert "computing scattering features for 5 images (cache disabled)" in capsys.readouterr().err


@pytest.mark.parametrize("tensor", [
    torch.arange(24, dtype=torch.float64).reshape(2, 3, 4),
    torch.tensor([[1.5, float("nan")], [float("-inf"), -0.0]]),
    torch.randn(3, 5).to(torch.bfloat16),
    torch.arange(7, dtype=torch.int64),
    torch.zeros(0, 4),
])
def test_tensor_file_round_trip(tmp_path: Path, tensor: torch.Tensor) -> None:
    params = {"name": "t", "shape": list(tensor.shape)}
    path = cache.entry_path(tmp_path, "t", params)
    assert cache.load_tensor(path, params) is None
    cache.save_tensor(path, tensor, params)
    back = cache.load_tensor(path, params)
    assert back.dtype == tensor.dtype and back.shape == tensor.shape and _bits(back) == _bits(tensor)
