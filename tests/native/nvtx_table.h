/*
 * The injection library loaded and driven as NVTX drives it (its InitializeInjectionNvtx2 and a callback table of
 * our own), for the test programs in this folder: no NVTX header or GPU is needed.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>

typedef void (*Fp)(void);
static Fp slots[16][16];
static Fp *tables[16][16];
static int get_table(int module, Fp ***table, unsigned *size)
{
    for (int i = 0; i < 16; ++i) tables[module][i] = &slots[module][i];
    *table = tables[module];
    *size = 16;
    return 1;
}
static struct { size_t size; int (*get)(int, Fp ***, unsigned *); } callbacks = {sizeof callbacks, get_table};
static const void *export_table(uint32_t id) { return id == 1 ? (const void *)&callbacks : NULL; }

/* Load the library at ``path`` and find NVTX's core RangePushA and RangePop in what it filled in; 0 where it
 * cannot be loaded or initialised (said on stderr). */
static int load_injection(const char *path, int (**push)(const char *), int (**pop)(void))
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 0; }
    int (*init)(const void *(*)(uint32_t)) = (int (*)(const void *(*)(uint32_t)))dlsym(lib, "InitializeInjectionNvtx2");
    if (!init || !init(export_table)) { fprintf(stderr, "%s: not initialised\n", path); return 0; }
    *push = (int (*)(const char *))slots[1][9];
    *pop = (int (*)(void))slots[1][11];
    return 1;
}
