// Shared by the C++ oracles (bench/oracle_loops.cu, bench/eager_gpu_oracle.cu): the spin kernel pcietrace's own
// loops run (pcietrace/device/kernels.py, written again here so the oracles owe nothing to the package), and
// CK, which checks a driver call, names the failing call on stderr and returns its CUresult.
#pragma once
#include <cuda.h>
#include <cstdio>

extern "C" __global__ void pt_spin(unsigned long long ns, unsigned long long* elapsed)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    t = t0;
    while (t - t0 < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }
    if (elapsed != 0 && threadIdx.x == 0) { *elapsed = t - t0; }
}

#define CK(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s = "?"; cuGetErrorName(e, &s); \
    std::fprintf(stderr, "oracle: %s failed: %s\n", #x, s); return (int)e; } } while (0)
