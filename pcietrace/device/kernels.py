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

# Latency kernels (one thread). ``pt_chase`` follows a chain of pointers with loads that are never
# served from a cache (ld.global.cv re-fetches system-memory lines), so each step is one full round
# trip to wherever the chain lives: pinned host memory (a PCIe read), device memory, or a peer GPU.
# ``pt_flag`` stores to host-mapped memory as its first and last instructions, so the host can see
# when the kernel started and ended.
LATENCY_SOURCE = r"""
extern "C" __global__ void pt_chase(const unsigned long long* start, unsigned long long steps,
                                    unsigned long long* out)
{
    const unsigned long long* p = start;
    unsigned long long next, t0, t1;
    asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(next) : "l"(p));  // first touch (TLB) untimed
    p = (const unsigned long long*)next;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (unsigned long long i = 0; i < steps; ++i) {
        asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(next) : "l"(p));
        p = (const unsigned long long*)next;
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[0] = t1 - t0;
    out[1] = (unsigned long long)p;  // keeps the chain live
}

extern "C" __global__ void pt_flag(volatile unsigned int* flag, unsigned int value, unsigned long long spin_ns)
{
    flag[0] = value;
    __threadfence_system();
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    t = t0;
    while (t - t0 < spin_ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }
    flag[1] = value;
    __threadfence_system();
}
"""
