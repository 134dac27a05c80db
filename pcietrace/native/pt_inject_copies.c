/* The injection library (pt_inject.h lists its units): two copies of it in one process. */
#include "pt_inject.h"

/* ---- two copies in one process: the first loaded records, a later one only forwards ----
 * Two paths are two objects (attach from one install wrapping a program that runs attach from another, or the
 * library added to LD_PRELOAD by hand beside attach's): each would count every launch that passes through both
 * (direct calls go from one's definition to the next) and truncate the other's trace. Every copy exports
 * pcietrace_inject_copy; the copy that records is the first object, in load order (dl_iterate_phdr: preloads,
 * then each dlopen), that defines it. Not a lookup in the global scope (RTLD_DEFAULT): copies that NVTX's or
 * CUDA's loader opened RTLD_LOCAL are not there, and two such would each find only themselves. The same path
 * loaded twice is one object, which finds itself. A copy built before the marker (4aa36b5) is known by its
 * file name (_pt_inject*, setup.py's) and NVTX's entry point; it records, knowing nothing of later copies. The
 * passive copy says so in the recording copy's trace (a "copy" event, message = its path), where that copy
 * exports pcietrace_inject_copy_loaded. */
static const char k_marker[] = "pcietrace injection library";
/* exported as an alias: this copy's own code refers to k_marker, which no other copy's definition interposes */
EXPORT extern const char pcietrace_inject_copy[sizeof k_marker] __attribute__((alias("k_marker")));
_Atomic int g_passive = -1;
static void *g_first;       /* that copy's handle */
static pthread_once_t g_copies_once = PTHREAD_ONCE_INIT;

/* Called by a later, passive copy (``path``: its file): the trace says a second copy forwarded to this one. */
EXPORT void pcietrace_inject_copy_loaded(const char *path) { emit("copy", NULL, 0, path); }

struct earlier { uintptr_t self; char **names; size_t n, cap; };

/* dl_iterate_phdr's visit: the name of each object loaded before this one; stops at this one. */
static int note_earlier(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct earlier *e = data;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t at = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && e->self >= at && e->self - at < ph->p_memsz) return 1;
    }
    if (!*info->dlpi_name) return 0;  /* the program itself: a copy is never that */
    if (e->n == e->cap) {
        char **more = realloc(e->names, (e->cap = e->cap ? 2 * e->cap : 64) * sizeof *more);
        if (!more) return 1;
        e->names = more;
    }
    if ((e->names[e->n] = strdup(info->dlpi_name))) ++e->n;  /* copied: an object may be unloaded meanwhile */
    return 0;
}

/* Whether ``name`` (an earlier object's path) is a copy built before the marker: setup.py's file name and
 * NVTX's entry point, defined there. */
static int unmarked_copy(const char *name, void *h)
{
    const char *base = strrchr(name, '/');
    Dl_info there;
    void *entry = real_dlsym_fn(h, "InitializeInjectionNvtx2");
    return !strncmp(base ? base + 1 : name, "_pt_inject", 10) && entry && dladdr(entry, &there) &&
           !strcmp(there.dli_fname, name);
}

static void copies_resolve(void)
{
    struct earlier e = {(uintptr_t)(void *)copies_resolve, NULL, 0, 0};
    dl_iterate_phdr(note_earlier, &e);
    /* dlopen and dlsym outside the visit: dl_iterate_phdr holds the loader's list lock */
    const char *marker = NULL;
    char *unmarked = NULL;  /* the first copy built before the marker, if no marked copy came before */
    for (size_t i = 0; i < e.n; ++i) {
        void *h = marker ? NULL : dlopen(e.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            marker = real_dlsym_fn(h, "pcietrace_inject_copy");
            if (!marker && !unmarked && unmarked_copy(e.names[i], h)) unmarked = strdup(e.names[i]);
            dlclose(h);
        }
        free(e.names[i]);
    }
    Dl_info there;  /* (found in that object or one it depends on: the copy is the object that defines it) */
    int later = (marker && marker != k_marker) || (!marker && unmarked);
    if (marker && later && dladdr(marker, &there)) g_first = dlopen(there.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    else if (later && unmarked) g_first = dlopen(unmarked, RTLD_LAZY | RTLD_NOLOAD);
    free(unmarked);
    free(e.names);
    dlerror();  /* the objects probed in vain are no error of the program's */
    atomic_store_explicit(&g_passive, later, memory_order_release);
    void (*loaded)(const char *) = g_first ? (void (*)(const char *))real_dlsym_fn(g_first, "pcietrace_inject_copy_loaded") : NULL;
    if (loaded && dladdr(k_marker, &there)) loaded(there.dli_fname);
    dlerror();
}

/* passive()'s first answer (pt_inject.h): found once, every thread waiting for it */
int passive_resolve(void)
{
    pthread_once(&g_copies_once, copies_resolve);
    return atomic_load_explicit(&g_passive, memory_order_acquire);
}

/* The recording copy's ``name`` (a passive copy hands NVTX's and CUDA's initialisation to it). */
void *first_copy(const char *name) { return passive() && g_first ? real_dlsym_fn(g_first, name) : NULL; }
