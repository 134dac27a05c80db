"""`pcietrace attach` end to end without a GPU, for tests/test_idle_sampling.py: the CUDA device list, the GPU
records and NVML's counter reads are stand-ins (each read of a fake GPU adds 1,000 B to both counters, as if
a read were all the PCIe traffic there is); the injection library, the nvtx package, the samplers, the
idle windows, the analysis and the report are the real ones. Spawned sampler children import this main
module first, so the stand-in reader reaches them.

    python3 attach_fake_gpu.py ATTACH-ARGS...        (as `pcietrace ATTACH-ARGS...`)
"""

from __future__ import annotations

import sys

from pcietrace.collectors import nvml

BYTES_PER_READ = 1000


class FakeReader:
    """Stands in for NVML's CounterReader: every read moves the counters by BYTES_PER_READ."""

    def __init__(self, index: int, mode: str | None = None) -> None:
        self.index, self.mode, self.bits, self.n = index, "fields", 32, 0

    def read(self) -> tuple[int, int]:
        self.n += 1
        v = self.n * BYTES_PER_READ % 2**32
        return v, v


nvml.CounterReader = FakeReader

if __name__ == "__main__":
    from pcietrace.cli import main
    from pcietrace.collectors import topology
    from pcietrace.device import backend, cuda

    cuda.bus_ids = lambda: ["0000:00:06.0", "0000:00:07.0"]
    backend.describe_gpus = lambda ordinals: [
        {"nvml_index": o, "name": "FAKE (no GPU)", "bus_id": f"0000:00:0{6 + o}.0", "uuid": "none",
         "pcie_gen_current": None, "pcie_gen_max": None, "pcie_width_current": None, "pcie_width_max": None,
         "numa_node": None, "cuda_ordinal": o}
        for o in ordinals]
    nvml.driver_version = lambda: "none (stand-in)"
    topology.collect = lambda gpus=None, sysfs_root="/sys": None
    sys.exit(main(sys.argv[1:]))
