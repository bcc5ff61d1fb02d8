"""bench's GPU monitor on the CPU: sampling on a thread from a stand-in source, the NVML calls against a stand-in
library (units, the clock-reason bits), the summary and log line, and run_configs carrying the samples into records."""

from __future__ import annotations

import ctypes
import math
import time

import pytest
import torch
from rich.console import Console

from ltxbench.bench import gpu_monitor
from ltxbench.bench.e2e import run_configs
from ltxbench.bench.e2e_report import render_table
from ltxbench.models import family_of
from ltxbench.models.ltx import LTXSettings


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
    assert {len(samples[name]) for name in gpu_monitor.FIELDS} == {len(samples["sm_mhz"])}
    assert samples["window_energy_j"] == samples["window_s"] == []  # no energy counter given


def test_the_energy_counter_is_read_at_both_ends_of_each_window():
    counter = iter([1000.0, 1012.5, 2000.0, 2030.0])
    monitor = gpu_monitor.GpuMonitor(lambda: (1755.0, 650.0, 60.0, 0x4), interval_s=10.0,
                                     energy=lambda: next(counter))
    for _ in range(2):
        with monitor:
            time.sleep(0.02)
    assert monitor.samples["window_energy_j"] == [12.5, 30.0]
    assert len(monitor.samples["window_s"]) == 2 and all(0.015 < s < 5 for s in monitor.samples["window_s"])


def test_an_energy_counter_that_fails_leaves_the_window_out():
    def unsupported():
        raise OSError("energy (nvmlReturn_t 3)")

    with gpu_monitor.GpuMonitor(lambda: (1755.0, 650.0, 60.0, 0x4), interval_s=10.0, energy=unsupported) as monitor:
        pass
    assert len(monitor.samples["sm_mhz"]) == 2 and math.isnan(monitor.samples["window_energy_j"][0])
    assert "gpu_energy_j" not in gpu_monitor.summarize(monitor.samples, iterations=3)
    # pooled with a round whose counter worked, the run still reports no energy rather than half of it
    pooled = {name: values + values for name, values in monitor.samples.items()}
    pooled["window_energy_j"][1], pooled["window_s"][1] = 10.0, 1.0
    assert "gpu_energy_j" not in gpu_monitor.summarize(pooled, iterations=6)


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

    def nvmlDeviceGetTotalEnergyConsumption(self, device, out):
        return self._put(out, 123_456_789)  # millijoules


@pytest.mark.parametrize("reasons_name", ["nvmlDeviceGetCurrentClocksEventReasons",
                                          "nvmlDeviceGetCurrentClocksThrottleReasons"])
def test_nvml_readings_in_their_units(monkeypatch, reasons_name):
    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeNvmlLibrary(reasons_name))
    nvml = gpu_monitor.Nvml("00000000:65:00.0")
    assert nvml.sample() == (1755.0, 699.5, 63.0, 0x4) and nvml.energy_j() == 123_456.789


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
    # two windows of 2 s and 1 s holding 6 iterations: 1950 J over 3 s
    metered = gpu_monitor.summarize({**samples, "window_energy_j": [1300.0, 650.0], "window_s": [2.0, 1.0]}, 6)
    assert metered == {**summary, "gpu_energy_j": 1950.0, "gpu_power_w_mean": 650.0,
                       "gpu_energy_j_per_iteration": 325.0}
    assert gpu_monitor.describe(metered).endswith("power-capped 67%, 325.0 J per iteration (mean 650 W)")


def test_run_configs_samples_the_timed_repeats_and_records_carry_the_summary():
    """The monitor starts after the warmups, before the repeats; the samples of two rounds are pooled; every timed
    record gets the gpu_* fields."""
    runs, opened, clock = [], [], [1900.0]

    def monitor(device):
        # the process's untimed first iteration, then per round 1 warmup before the monitor and 2 repeats after it
        assert len(runs) == 2 + 3 * len(opened), "opened before the warmup ended or after a repeat"
        opened.append(device)

        def source():
            clock[0] -= 10
            return clock[0], 650.0, 60.0, 0x4

        joules = iter([0.0, 13.0])  # 13 J over each window of two repeats

        return gpu_monitor.GpuMonitor(source, interval_s=10.0, energy=lambda: next(joules))  # samples at entry, exit

    def run(name):
        runs.append(name)
        return {"total_ms": 10.0, "step_ms": [5.0, 5.0]}

    lines = []
    results = run_configs(torch.nn.Linear(2, 2), ["baseline"], lambda name: None, run, 1, 2, torch.device("cpu"),
                          lines.append, rounds=2, monitor=monitor)
    samples = results["baseline"]["gpu_samples"]
    assert len(opened) == 2 and len(samples["sm_mhz"]) == 4 and samples["power_capped"] == [1, 1, 1, 1]
    assert "SM " in lines[-1] and "power-capped 100%" in lines[-1] and "6.5 J per iteration" in lines[-1]
    settings = LTXSettings(model="ltx-2b", weights="random", dtype="fp32")
    records = family_of("ltx-2b").records(results, {"model": "test"}, settings)
    timed = [r for r in records if r["name"] in ("denoise_step", "total")]
    assert timed and all(r["derived"]["gpu_samples"] == 4 and r["derived"]["gpu_sm_mhz_min"] == 1860.0
                         and r["derived"]["gpu_energy_j_per_iteration"] == 26.0 / 4 for r in timed)
    step = next(r for r in records if r["name"] == "denoise_step")["derived"]
    window_s = sum(samples["window_s"])
    assert step["gpu_power_w_mean"] == pytest.approx(26.0 / window_s)
    assert step["gpu_energy_j_per_step"] == pytest.approx(26.0 / window_s * 5.0 / 1e3)  # mean power x median step
    console = Console(record=True, width=250)
    console.print(render_table(records))
    text = console.export_text()
    assert "SM MHz (capped)" in text and "1875 (100%)" in text  # median of 1890, 1880, 1870, 1860
    assert "J/step" in text and f"{step['gpu_energy_j_per_step']:.1f}" in text
    console.print(render_table([{**r, "derived": {}} for r in records]))
    text = console.export_text()
    assert text.count("SM MHz") == 0 and text.count("J/step") == 0  # unsampled runs: no columns


@pytest.mark.gpu
def test_the_real_gpu_is_sampled_with_plausible_readings():
    monitor = gpu_monitor.open_monitor("cuda")
    assert monitor is not None, "NVML (libnvidia-ml.so.1) or the device's PCI address not found"
    x = torch.randn(4096, 4096, device="cuda")
    with monitor:
        for _ in range(200):  # ~0.5 s: several updates of NVML's energy counter
            x = x @ x.T / 4096
        torch.cuda.synchronize()
    summary = gpu_monitor.summarize(monitor.samples, iterations=200)
    assert 100 <= summary["gpu_sm_mhz_min"] <= summary["gpu_sm_mhz_median"] <= 5000
    assert 10 <= summary["gpu_power_w_median"] <= 2000 and 0 < summary["gpu_temp_c_max"] < 120
    assert 10 <= summary["gpu_power_w_mean"] <= 2000 and summary["gpu_energy_j_per_iteration"] > 0
