"""Utilisation samples: one rank's process (CPU %, resident memory, its GPU) and a whole node
(CPU %, memory, every GPU). CPU and memory come from psutil; GPU utilisation and memory from
NVML (nvidia-ml-py, the optional `meshyard[nvml]` extra): without it, or on a node without a
driver, the GPU fields are None.

The worker actor samples its process at most every `min_interval_s` when the controller polls
it; the runtime samples every node through one long-lived `NodeSampler` actor pinned there
(orchestrator/runtime/node_sampling.py).
"""

from __future__ import annotations

import time
from typing import Any

import psutil


class Nvml:
    """NVML opened once per process. `module` is pynvml or a stand-in with its names (tests);
    every call that fails or is unsupported yields None, never an exception."""

    def __init__(self, module: Any | None = None) -> None:
        self.ok = False
        self._nvml: Any = module
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
            self.ok = True
        except Exception:  # noqa: BLE001 - no library, no driver: a CPU node
            self.ok = False

    def count(self) -> int:
        if not self.ok:
            return 0
        try:
            return int(self._nvml.nvmlDeviceGetCount())
        except Exception:  # noqa: BLE001
            return 0

    def gpu(self, index: int) -> dict[str, Any] | None:
        """{index, util, mem_used_bytes, mem_total_bytes} of one physical GPU, or None."""
        if not self.ok:
            return None
        try:
            h = self._nvml.nvmlDeviceGetHandleByIndex(index)
            util = self._nvml.nvmlDeviceGetUtilizationRates(h)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
        except Exception:  # noqa: BLE001
            return None
        return {"index": index, "util": float(util.gpu), "mem_used_bytes": int(mem.used),
                "mem_total_bytes": int(mem.total)}


class ProcessSampler:
    """This process and its GPU (`gpu_index`: the physical index Ray assigned, None on CPU).

    >>> s = ProcessSampler(gpu_index=None, nvml=Nvml(module=object()), min_interval_s=0)
    >>> sorted(s.sample())
    ['at', 'cpu_percent', 'gpu_mem_bytes', 'gpu_mem_total_bytes', 'gpu_util', 'rss_bytes']
    """

    def __init__(self, *, gpu_index: int | None, nvml: Nvml | None = None,
                 min_interval_s: float = 2.0) -> None:
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call starts the measurement window
        self._gpu_index = gpu_index
        self._nvml = nvml if nvml is not None else (Nvml() if gpu_index is not None else None)
        self._min_interval_s = min_interval_s
        self._last = 0.0

    def sample(self) -> dict[str, Any] | None:
        """A sample, or None when the last one is more recent than `min_interval_s`."""
        now = time.time()
        if now - self._last < self._min_interval_s:
            return None
        self._last = now
        with self._proc.oneshot():
            cpu, rss = self._proc.cpu_percent(None), self._proc.memory_info().rss
        gpu = self._nvml.gpu(self._gpu_index) \
            if self._nvml is not None and self._gpu_index is not None else None
        return {"at": now, "cpu_percent": cpu, "rss_bytes": int(rss),
                "gpu_util": gpu["util"] if gpu else None,
                "gpu_mem_bytes": gpu["mem_used_bytes"] if gpu else None,
                "gpu_mem_total_bytes": gpu["mem_total_bytes"] if gpu else None}


class NodeSampler:
    """Samples of the node this process runs on (CPU %, memory in use, every GPU NVML sees),
    for a process that lives across samples: NVML is opened once, and a sample's CPU % covers
    the time since the previous sample, at least `cpu_window_s` (a sample that follows the
    previous one sooner waits out the rest of the window).

    >>> s = NodeSampler(nvml=Nvml(module=object()), cpu_window_s=0.01)
    >>> sorted(s.sample("n1"))
    ['at', 'cpu_percent', 'gpus', 'mem_total_bytes', 'mem_used_bytes', 'node']
    """

    def __init__(self, *, nvml: Nvml | None = None, cpu_window_s: float = 0.5) -> None:
        self._nvml = nvml if nvml is not None else Nvml()
        self._cpu_window_s = cpu_window_s
        psutil.cpu_percent(interval=None)  # starts the first window
        self._last = time.monotonic()  # when the current window started

    def sample(self, node: str) -> dict[str, Any]:
        """One NodeUsage row for `node` (the name the store knows this node by)."""
        short = self._cpu_window_s - (time.monotonic() - self._last)
        if short > 0:
            time.sleep(short)
        cpu = psutil.cpu_percent(interval=None)  # since the previous call in this process
        self._last = time.monotonic()
        mem = psutil.virtual_memory()
        gpus = [g for i in range(self._nvml.count()) if (g := self._nvml.gpu(i)) is not None]
        return {"node": node, "at": time.time(), "cpu_percent": cpu,
                "mem_used_bytes": int(mem.total - mem.available),
                "mem_total_bytes": int(mem.total), "gpus": gpus}
