/*
 * A fake libnvidia-ml.so.1 for CPU tests of the injection library's own counter reads (attach --exact-edges):
 * the five entry points it uses. Like NVML, it serializes a process's reads (one lock); each read takes
 * fake_read_us (default 2000) and returns PCIe counters that grow by 1000 B per read.
 * Build: cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_libnvml.c -lpthread
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn;
                 union { unsigned uiVal; unsigned long long ullVal; } value; } Field;

long long fake_read_us = 2000, fake_reads;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(uintptr_t)(i + 1); return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **h) { (void)bus; *h = (void *)1; return 0; }
int nvmlDeviceGetIndex(void *h, unsigned *i) { *i = (unsigned)((uintptr_t)h - 1); return 0; }

int nvmlDeviceGetFieldValues(void *h, int n, Field *f)
{
    (void)h;
    pthread_mutex_lock(&lock);
    struct timespec d = {fake_read_us / 1000000, (fake_read_us % 1000000) * 1000};
    nanosleep(&d, NULL);
    ++fake_reads;
    for (int i = 0; i < n; ++i) {
        f[i].valueType = 3;  /* unsigned long long */
        f[i].nvmlReturn = 0;
        f[i].value.ullVal = (unsigned long long)fake_reads * 1000;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}
