"""CUDA C++ sources compiled at run time with NVRTC.

``pt_spin`` busy-waits on the GPU's global nanosecond timer for ``ns`` nanoseconds, so its duration is
set per launch by a plain argument (no recompilation); ``ns == 0`` is an empty kernel. It touches no
host memory: every PCIe byte seen while it runs is the cost of launching it. Where ``elapsed`` is
non-null, the first thread stores how long it actually spun (for calibration).
"""

SPIN_SOURCE = r"""
extern "C" __global__ void pt_spin(unsigned long long ns, unsigned long long* elapsed)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    t = t0;
    while (t - t0 < ns) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
    if (elapsed != 0 && threadIdx.x == 0) {
        *elapsed = t - t0;
    }
}
"""
