"""The GPU's SM clock, power draw and temperature, sampled while a benchmark's timed iterations run, so that a result
says under which clocks it was measured. A GPU at its power cap (700 W on the H100) lowers its SM clock, so two runs
that differ by 1-2% may differ by clock rather than by code (every LTX configuration but the 49-frame eager one ran
at the cap on the H100: docs/performance.md#the-power-cap).

The same library's energy counter (millijoules since the driver loaded) is read when the timed window opens and
closes: the energy per iteration and the window's mean power. The model of the capped step
(docs/tuning.md#what-bounds-the-161-frame-step) is that its time follows its energy more than the sum of its kernels'
durations; joules per step are the figure that tests it, and that says whether a change made the work cheaper or only
moved it.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import threading
import time

CLOCK_SM = 1              # nvmlClockType_t NVML_CLOCK_SM
TEMPERATURE_GPU = 0       # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
# nvmlClocksEventReasons: why the clock is below its maximum. Power: the software power cap or the hardware power
# brake; thermal: software or hardware thermal slowdown.
POWER_REASONS = 0x4 | 0x80
THERMAL_REASONS = 0x20 | 0x40
FIELDS = ("sm_mhz", "power_w", "temp_c", "power_capped", "thermal_capped")
# One entry per timed window (not per sample): the energy counter's difference over it, and its length.
WINDOW_FIELDS = ("window_energy_j", "window_s")


class Nvml:
    """The few NVML calls the monitor needs, on one device found by its PCI address (CUDA's index can differ)."""

    def __init__(self, pci_bus_id: str, library: str = "libnvidia-ml.so.1"):
        self.lib = ctypes.CDLL(library)
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")
        self.device = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(self.device)),
                    f"no NVML device at PCI address {pci_bus_id}")
        # Renamed in CUDA 12.x drivers; the old name stays exported for compatibility.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise OSError(f"{what} (nvmlReturn_t {status})")

    def sample(self) -> tuple[float, float, float, int]:
        """(SM clock MHz, power W, temperature C, clock event reasons bitmask)."""
        mhz, milliwatts, celsius = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        reasons = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.device, CLOCK_SM, ctypes.byref(mhz)), "clock")
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.device, ctypes.byref(milliwatts)), "power")
        self._check(self.lib.nvmlDeviceGetTemperature(self.device, TEMPERATURE_GPU, ctypes.byref(celsius)), "temp")
        self._check(self._reasons(self.device, ctypes.byref(reasons)), "clock event reasons")
        return float(mhz.value), milliwatts.value / 1e3, float(celsius.value), int(reasons.value)

    def energy_j(self) -> float:
        """The GPU's energy counter in joules (NVML counts millijoules since the driver loaded; Volta and later)."""
        millijoules = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.device, ctypes.byref(millijoules)), "energy")
        return millijoules.value / 1e3


def pci_bus_id(device) -> str:
    """NVML's "domain:bus:device.function" address of a torch CUDA device."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"


class GpuMonitor:
    """A context manager sampling `source()` every `interval_s` on a thread; `samples` holds one list per FIELDS
    entry (power_capped / thermal_capped are 0 or 1 per sample). A source that fails stops the sampling, quietly.
    With `energy` (a counter in joules), each window adds one entry to the WINDOW_FIELDS lists (NaN where the
    counter could not be read at both ends)."""

    def __init__(self, source, interval_s: float = 0.05, energy=None):
        self.source, self.interval_s, self.energy = source, interval_s, energy
        self.samples: dict[str, list[float]] = {name: [] for name in FIELDS + WINDOW_FIELDS}
        self._window_start: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> bool:
        try:
            mhz, watts, celsius, reasons = self.source()
        except OSError:
            return False
        for name, value in zip(FIELDS, (mhz, watts, celsius, int(bool(reasons & POWER_REASONS)),
                                        int(bool(reasons & THERMAL_REASONS))), strict=True):
            self.samples[name].append(value)
        return True

    def _loop(self) -> None:
        while self._record() and not self._stop.wait(self.interval_s):
            pass

    def _read_energy(self) -> float | None:
        try:
            return self.energy() if self.energy is not None else None
        except OSError:  # e.g. NVML_ERROR_NOT_SUPPORTED: the run goes on without energy
            return None

    def __enter__(self) -> GpuMonitor:
        joules = self._read_energy()
        self._window_start = None if joules is None else (joules, time.perf_counter())
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ltxbench-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._record()  # at least one sample, however short the run
        if self.energy is None:
            return
        # A window whose counter failed at either end stays as NaN, so that pooled rounds never divide one round's
        # energy by every round's iterations.
        joules, energy_j, window_s = self._read_energy(), math.nan, math.nan
        if self._window_start is not None and joules is not None:
            start_joules, start_s = self._window_start
            energy_j, window_s = joules - start_joules, time.perf_counter() - start_s
        self.samples["window_energy_j"].append(energy_j)
        self.samples["window_s"].append(window_s)


def open_monitor(device, interval_s: float = 0.05) -> GpuMonitor | None:
    """A GpuMonitor of a torch CUDA device, or None where NVML or the device cannot be reached (or not a GPU)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        nvml = Nvml(pci_bus_id(device))
        nvml.sample()
    except (OSError, AttributeError, RuntimeError, AssertionError):  # no driver library, symbol, device or GPU
        return None
    return GpuMonitor(nvml.sample, interval_s, energy=nvml.energy_j)


def summarize(samples: dict | None, iterations: int | None = None) -> dict:
    """derived fields of a result record from a monitor's (possibly pooled) samples; {} without samples. Where the
    energy counter was read: the windows' energy and mean power, and per iteration when `iterations` (the timed
    repeats the windows held) is given."""
    if not samples or not samples.get("sm_mhz"):
        return {}
    summary = {"gpu_sm_mhz_median": statistics.median(samples["sm_mhz"]), "gpu_sm_mhz_min": min(samples["sm_mhz"]),
               "gpu_power_w_median": statistics.median(samples["power_w"]), "gpu_power_w_max": max(samples["power_w"]),
               "gpu_temp_c_max": max(samples["temp_c"]),
               "gpu_power_capped_share": sum(samples["power_capped"]) / len(samples["power_capped"]),
               "gpu_thermal_capped_share": sum(samples["thermal_capped"]) / len(samples["thermal_capped"]),
               "gpu_samples": len(samples["sm_mhz"])}
    windows_s = sum(samples.get("window_s", []))
    if windows_s > 0:  # NaN (a window without energy) fails this too
        joules = sum(samples["window_energy_j"])
        summary.update(gpu_energy_j=joules, gpu_power_w_mean=joules / windows_s)
        if iterations:
            summary["gpu_energy_j_per_iteration"] = joules / iterations
    return summary


def describe(derived: dict) -> str:
    """", SM 1755 MHz (min 1605), 690 W, 64 C, power-capped 83%, 15.2 J per iteration (mean 655 W)" for a log line
    (the energy part where the counter was read); "" without samples."""
    if "gpu_sm_mhz_median" not in derived:
        return ""
    energy = ""
    if "gpu_energy_j_per_iteration" in derived:
        energy = (f", {derived['gpu_energy_j_per_iteration']:.1f} J per iteration "
                  f"(mean {derived['gpu_power_w_mean']:.0f} W)")
    return (f", SM {derived['gpu_sm_mhz_median']:.0f} MHz (min {derived['gpu_sm_mhz_min']:.0f}), "
            f"{derived['gpu_power_w_median']:.0f} W, {derived['gpu_temp_c_max']:.0f} C, "
            f"power-capped {100 * derived['gpu_power_capped_share']:.0f}%{energy}")
