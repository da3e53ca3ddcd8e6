"""``benchmarks.dpsgd``'s breakdown on CUDA: a profile with CUDA activity lists each labelled
range twice in ``key_averages()``, once as a CPU row (its CPU time, and the time of the
kernels it launched) and once as a CUDA row (CPU time 0). Seen on an H100 (docs/gpu.md):
the CUDA rows overwrote the CPU ones and every stage read 0 ms."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from benchmarks.dpsgd import per_step_gpu_ms, per_step_ms


def _row(key: str, device: DeviceType, cpu_us: float, device_us: float) -> SimpleNamespace:
    return SimpleNamespace(key=key, device_type=device, cpu_time_total=cpu_us, device_time_total=device_us)


def test_a_cuda_profile_reports_each_stage_from_its_cpu_row() -> None:
    # the rows' shape and order as torch 2.11 gave them on the H100 (5 steps of the MLP)
    rows = [_row("fedpriv.step", DeviceType.CPU, 25818.6, 818.4), _row("fedpriv.step", DeviceType.CUDA, 0, 22511.8),
            _row("dpsgd.noise", DeviceType.CPU, 280.6, 26.0), _row("dpsgd.noise", DeviceType.CUDA, 0, 26.0)]
    assert per_step_ms(rows, steps=5) == {"fedpriv.step": 25818.6 / 5e3, "dpsgd.noise": 280.6 / 5e3}
    # the GPU time of a range: the kernels it launched (its CPU row), not its span on the GPU's timeline
    assert per_step_gpu_ms(rows, steps=5) == {"fedpriv.step": 818.4 / 5e3, "dpsgd.noise": 26.0 / 5e3}


def test_a_cpu_profile_has_no_gpu_times() -> None:
    rows = [_row("fedpriv.step", DeviceType.CPU, 1000.0, 0)]
    assert per_step_ms(rows, steps=2) == {"fedpriv.step": 0.5}
    assert per_step_gpu_ms(rows, steps=2) == {"fedpriv.step": 0.0}
