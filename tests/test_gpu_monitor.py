"""bench's GPU monitor on the CPU: sampling on a thread from a stand-in source, the NVML calls against a stand-in
library (units, the clock-reason bits), the summary and log line, and run_configs carrying the samples into records."""

from __future__ import annotations

import ctypes
import time

import pytest
import torch
from rich.console import Console

from ltxbench.bench import gpu_monitor
from ltxbench.bench.e2e import build_records, run_configs
from ltxbench.bench.e2e_report import render_table


def test_the_monitor_samples_on_a_thread_until_it_exits():
    readings = iter([(1980.0, 350.0, 40.0, 0x0), (1755.0, 699.0, 61.0, 0x4), (1605.0, 700.0, 66.0, 0x4 | 0x20)])
    last = (1700.0, 690.0, 62.0, 0x80)
    monitor = gpu_monitor.GpuMonitor(lambda: next(readings, last), interval_s=0.001)
    with monitor:
        deadline = time.monotonic() + 5
        while len(monitor.samples["sm_mhz"]) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
    samples = monitor.samples
    assert samples["sm_mhz"][:3] == [1980.0, 1755.0, 1605.0] and len(samples["sm_mhz"]) >= 6  # + one at exit
    assert samples["power_capped"][:4] == [0, 1, 1, 1] and samples["thermal_capped"][:4] == [0, 0, 1, 0]
    assert {len(v) for v in samples.values()} == {len(samples["sm_mhz"])}


def test_a_failing_source_stops_the_sampling_quietly():
    def source():
        raise OSError("NVML went away")

    with gpu_monitor.GpuMonitor(source, interval_s=0.001) as monitor:
        time.sleep(0.01)
    assert monitor.samples["sm_mhz"] == [] and gpu_monitor.summarize(monitor.samples) == {}


class FakeNvmlLibrary:
    """libnvidia-ml's calls used by Nvml: each writes its result through the pointer it is given."""

    def __init__(self, reasons_name="nvmlDeviceGetCurrentClocksEventReasons", found=True):
        self.found = found
        setattr(self, reasons_name, lambda device, out: self._put(out, 0x4))

    @staticmethod
    def _put(pointer, value):
        pointer._obj.value = value
        return 0

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, out):
        assert bus_id == b"00000000:65:00.0"
        return self._put(out, 1234) if self.found else 13  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetClockInfo(self, device, clock_type, out):
        assert device.value == 1234 and clock_type == gpu_monitor.CLOCK_SM
        return self._put(out, 1755)

    def nvmlDeviceGetPowerUsage(self, device, out):
        return self._put(out, 699_500)  # milliwatts

    def nvmlDeviceGetTemperature(self, device, sensor, out):
        return self._put(out, 63)


@pytest.mark.parametrize("reasons_name", ["nvmlDeviceGetCurrentClocksEventReasons",
                                          "nvmlDeviceGetCurrentClocksThrottleReasons"])
def test_nvml_readings_in_their_units(monkeypatch, reasons_name):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeNvmlLibrary(reasons_name))
    assert gpu_monitor.Nvml("00000000:65:00.0").sample() == (1755.0, 699.5, 63.0, 0x4)


def test_no_nvml_or_no_such_device_means_no_monitor(monkeypatch):
    assert gpu_monitor.open_monitor("cpu") is None
    monkeypatch.setattr(gpu_monitor, "pci_bus_id", lambda device: "00000000:65:00.0")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeNvmlLibrary(found=False))
    assert gpu_monitor.open_monitor("cuda") is None
    with pytest.raises(OSError, match="no NVML device at PCI address 00000000:65:00.0"):
        gpu_monitor.Nvml("00000000:65:00.0")

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert gpu_monitor.open_monitor("cuda") is None
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeNvmlLibrary())
    assert isinstance(gpu_monitor.open_monitor("cuda"), gpu_monitor.GpuMonitor)


def test_summary_and_log_line():
    samples = {"sm_mhz": [1980.0, 1755.0, 1605.0], "power_w": [350.0, 699.0, 700.0], "temp_c": [40.0, 61.0, 66.0],
               "power_capped": [0, 1, 1], "thermal_capped": [0, 0, 1]}
    summary = gpu_monitor.summarize(samples)
    assert summary == {"gpu_sm_mhz_median": 1755.0, "gpu_sm_mhz_min": 1605.0, "gpu_power_w_median": 699.0,
                       "gpu_power_w_max": 700.0, "gpu_temp_c_max": 66.0, "gpu_power_capped_share": 2 / 3,
                       "gpu_thermal_capped_share": 1 / 3, "gpu_samples": 3}
    assert gpu_monitor.describe(summary) == ", SM 1755 MHz (min 1605), 699 W, 66 C, power-capped 67%"
    assert gpu_monitor.summarize(None) == {} and gpu_monitor.describe({}) == ""


def test_run_configs_samples_the_timed_repeats_and_records_carry_the_summary():
    """The monitor starts after the warmups, before the repeats; the samples of two rounds are pooled; every timed
    record gets the gpu_* fields."""
    runs, opened, clock = [], [], [1900.0]

    def monitor(device):
        assert len(runs) == 1 + 3 * len(opened), "opened before the warmup ended or after a repeat"  # 1 + 2 per round
        opened.append(device)

        def source():
            clock[0] -= 10
            return clock[0], 650.0, 60.0, 0x4

        return gpu_monitor.GpuMonitor(source, interval_s=10.0)  # one sample at entry, one at exit

    def run(name):
        runs.append(name)
        return {"total_ms": 10.0, "step_ms": [5.0, 5.0]}

    lines = []
    results = run_configs(torch.nn.Linear(2, 2), ["baseline"], lambda: None, run, 1, 2, torch.device("cpu"),
                          lines.append, rounds=2, monitor=monitor)
    samples = results["baseline"]["gpu_samples"]
    assert len(opened) == 2 and len(samples["sm_mhz"]) == 4 and samples["power_capped"] == [1, 1, 1, 1]
    assert "SM " in lines[-1] and "power-capped 100%" in lines[-1]
    records = build_records(results, {"model": "test"}, "fp32")
    timed = [r for r in records if r["name"] in ("denoise_step", "total")]
    assert timed and all(r["derived"]["gpu_samples"] == 4 and r["derived"]["gpu_sm_mhz_min"] == 1860.0
                         for r in timed)
    console = Console(record=True, width=250)
    console.print(render_table(records))
    text = console.export_text()
    assert "SM MHz (capped)" in text and "1875 (100%)" in text  # median of 1890, 1880, 1870, 1860
    console.print(render_table([{**r, "derived": {}} for r in records]))
    assert console.export_text().count("SM MHz") == 0  # unsampled runs: no column


@pytest.mark.gpu
def test_the_real_gpu_is_sampled_with_plausible_readings():
    monitor = gpu_monitor.open_monitor("cuda")
    assert monitor is not None, "NVML (libnvidia-ml.so.1) or the device's PCI address not found"
    x = torch.randn(4096, 4096, device="cuda")
    with monitor:
        for _ in range(20):
            x = x @ x.T / 4096
        torch.cuda.synchronize()
    summary = gpu_monitor.summarize(monitor.samples)
    assert 100 <= summary["gpu_sm_mhz_min"] <= summary["gpu_sm_mhz_median"] <= 5000
    assert 10 <= summary["gpu_power_w_median"] <= 2000 and 0 < summary["gpu_temp_c_max"] < 120
