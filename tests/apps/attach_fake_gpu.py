"""`pcietrace attach` end to end without a GPU, for tests/test_idle_sampling.py: the CUDA device list, the GPU
records and NVML's counter reads are stand-ins (each read of a fake GPU adds 1,000 B to both counters, as if
a read were all the PCIe traffic there is); the injection library, the nvtx package, the samplers, the
idle windows, the analysis and the report are the real ones. Spawned sampler children import this main
module first, so the stand-in reader reaches them.

    python3 attach_fake_gpu.py ATTACH-ARGS...        (as `pcietrace ATTACH-ARGS...`; PCIETRACE_FAKE_GPUS=N: N GPUs, default 2)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pcietrace.collectors import nvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for its NVML stand-ins
from fake_nvml import FakeCounterReader  # noqa: E402


class FakeReader(FakeCounterReader):
    bytes_per_read = 1000  # the docstring's 1,000 B per read


nvml.CounterReader = FakeReader

if __name__ == "__main__":
    from pcietrace.cli import main
    from pcietrace.collectors import topology
    from pcietrace.device import cuda

    gpus = int(os.environ.get("PCIETRACE_FAKE_GPUS", "2"))  # (bench/sampler_memory.py asks for 8)
    buses = [f"0000:00:{6 + o:02x}.0" for o in range(gpus)]
    cuda.bus_ids = lambda: buses
    nvml.index_for_bus_id = buses.index
    nvml.gpu_info = lambda i: nvml.GpuInfo(i, "FAKE (no GPU)", "none", buses[i], None, None, None, None, None)
    nvml.driver_version = lambda: "none (stand-in)"
    topology.collect = lambda gpus=None, sysfs_root="/sys": None
    sys.exit(main(sys.argv[1:]))
