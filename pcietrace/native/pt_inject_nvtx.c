/* The injection library (pt_inject.h lists its units): NVTX's injection entry point and its range handlers.
 * Domain handles and registered strings are strdup'ed names. */
#include "pt_inject.h"

/* ---- NVTX injection ABI (values from nvToolsExt's nvtxDetail/nvtxTypes.h) ---- */
typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct { size_t struct_size; int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *table, unsigned int *size); } NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);
enum { NVTX_ETID_CALLBACKS = 1, NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5 };
enum { CORE_MarkEx = 1, CORE_MarkA = 2, CORE_MarkW = 3, CORE_RangeStartEx = 4, CORE_RangeStartA = 5, CORE_RangeStartW = 6,
       CORE_RangeEnd = 7, CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePushW = 10, CORE_RangePop = 11 };
enum { CORE2_DomainMarkEx = 1, CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3, CORE2_DomainRangePushEx = 4,
       CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10, CORE2_DomainRegisterStringW = 11,
       CORE2_DomainCreateA = 12, CORE2_DomainCreateW = 13 };
/* nvtxEventAttributes_v2: message type at byte 32, message (char*, wchar_t* or string handle) at 40 */
typedef struct { uint16_t version, size; uint32_t category; int32_t colorType; uint32_t color; int32_t payloadType;
                 int32_t reserved0; uint64_t payload; int32_t messageType; int32_t pad; const void *message; } EventAttributes;
enum { MSG_ASCII = 1, MSG_UNICODE = 2, MSG_REGISTERED = 3 };

/* A wide (wchar_t: UTF-32 on Linux) NVTX message as UTF-8 in ``tmp``, whatever the program's locale (a C++
 * program that never calls setlocale runs in "C", where wcstombs fails on anything beyond ASCII); truncated at
 * a character boundary, a code point that is not one written as U+FFFD. */
static const char *narrow(const wchar_t *w, char *tmp, size_t tmpsize)
{
    if (!w) return "";
    size_t n = 0;
    for (; *w; ++w) {
        uint32_t c = (uint32_t)*w;
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
        int len = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        if (n + (size_t)len >= tmpsize) break;
        if (len == 1) { tmp[n++] = (char)c; continue; }
        static const unsigned char lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
        for (int i = len - 1; i > 0; --i, c >>= 6) tmp[n + (size_t)i] = (char)(0x80 | (c & 0x3F));
        tmp[n] = (char)(lead[len] | c);
        n += (size_t)len;
    }
    tmp[n] = 0;
    return tmp;
}

static const char *message_of(const EventAttributes *a, char *tmp, size_t tmpsize)
{
    if (!a || !a->message) return "";
    switch (a->messageType) {
    case MSG_ASCII: case MSG_REGISTERED: return (const char *)a->message;  /* our string handles are char* */
    case MSG_UNICODE: return narrow((const wchar_t *)a->message, tmp, tmpsize);
    default: return "";
    }
}

/* A push or pop nested in the thread's own counted range changes nothing the samplers look at: no shared word */
static int push_edge(const char *domain, const char *msg)
{
    int fast = holds_fast(domain);
    edge_read();
    if (fast && nested_push()) {  /* (counted before its event: only this thread reads the count) */
        emit_nested("push", 4, domain, msg);
    } else {
        emit("push", domain, 0, msg);
        edge_signal(fast ? open_push() : 1);
    }
    return t_depth++;
}
/* A pop with no range of the thread open is recorded (the analysis skips it) and returns -1: NVTX's error value
 * (a forked child's pop of a range its thread pushed before the fork too: the child's trace starts at depth 0) */
static int pop_edge(const char *domain)
{
    int level = t_depth > 0 ? --t_depth : -1;
    int fast = holds_fast(domain);
    if (fast && nested_pop()) {
        emit_nested("pop", 3, domain, "");
        edge_read();
        return level;
    }
    emit("pop", domain, 0, "");
    if (fast) close_pop();
    edge_close_range(!fast);
    return level;
}
static uint64_t start_edge(const char *domain, const char *msg) { unsigned long long id = atomic_fetch_add(&g_range_id, 1) + 1; edge_read(); emit("start", domain, id, msg); edge_signal(holds_fast(domain) ? open_start(id) : 1); return id; }
static void end_edge(const char *domain, uint64_t id) { emit("end", domain, id, ""); close_end(id); edge_close_range(!holds_fast(domain)); }

/* An edge's timing: one in PT_EDGE_TIMED_EVERY of each thread's edges is timed (edge_timed); the others read no
 * clock (``on`` 0) */
struct timing { int on; struct edge_clock clock; };
static inline struct timing timing_start(void)
{
    if (__builtin_expect(++t_untimed < PT_EDGE_TIMED_EVERY, 1)) return (struct timing){0};
    t_untimed = 0;
    return (struct timing){1, edge_clock_start()};
}
static inline void timing_end(struct timing t) { if (__builtin_expect(t.on, 0)) edge_timed(t.clock); }

/* PCIETRACE_MAX_DEPTH=N (attach --max-depth): a push range opened N or more deep in its thread is neither recorded
 * nor timed, nor is its pop: the push adds one to the thread's count and both keep the depth, so that an emit_nvtx
 * program's ops cost a few ns each instead of an event each. Their launches and copies stay in the ranges around
 * them (a thread's counts are cumulative). The count reaches the trace's header every UNRECORDED_BATCH, at the
 * thread's next recorded edge and at exit (a thread that ends inside a recorded range leaves < UNRECORDED_BATCH
 * uncounted). */
enum { UNRECORDED_BATCH = 64 };
static int g_max_depth = INT_MAX;
static int push_(const char *d, const char *m)
{
    if (__builtin_expect(t_depth >= g_max_depth, 0)) {
        if (__builtin_expect(++t_unrecorded >= UNRECORDED_BATCH, 0)) unrecorded_flush();
        return t_depth++;
    }
    unrecorded_flush();
    struct timing t = timing_start(); int r = push_edge(d, m); timing_end(t); return r;
}
static int pop_(const char *d)
{
    if (__builtin_expect(t_depth > g_max_depth, 0)) return --t_depth;
    unrecorded_flush();
    struct timing t = timing_start(); int r = pop_edge(d); timing_end(t); return r;
}
static uint64_t start_(const char *d, const char *m) { struct timing t = timing_start(); uint64_t r = start_edge(d, m); timing_end(t); return r; }
static void end_(const char *d, uint64_t id) { struct timing t = timing_start(); end_edge(d, id); timing_end(t); }

static int RangePushA(const char *m) { return push_(NULL, m); }
static int RangePushEx(const EventAttributes *a) { char t[1024]; return push_(NULL, message_of(a, t, sizeof t)); }
static int RangePop(void) { return pop_(NULL); }
static uint64_t RangeStartA(const char *m) { return start_(NULL, m); }
static uint64_t RangeStartEx(const EventAttributes *a) { char t[1024]; return start_(NULL, message_of(a, t, sizeof t)); }
static void RangeEnd(uint64_t id) { end_(NULL, id); }
static int RangePushW(const wchar_t *m) { char t[1024]; return push_(NULL, narrow(m, t, sizeof t)); }
static uint64_t RangeStartW(const wchar_t *m) { char t[1024]; return start_(NULL, narrow(m, t, sizeof t)); }
static void MarkA(const char *m) { emit("mark", NULL, 0, m); }
static void MarkW(const wchar_t *m) { char t[1024]; emit("mark", NULL, 0, narrow(m, t, sizeof t)); }
static void MarkEx(const EventAttributes *a) { char t[1024]; emit("mark", NULL, 0, message_of(a, t, sizeof t)); }
static int DomainRangePushEx(const char *d, const EventAttributes *a) { char t[1024]; return push_(d, message_of(a, t, sizeof t)); }
static int DomainRangePop(const char *d) { return pop_(d); }
static uint64_t DomainRangeStartEx(const char *d, const EventAttributes *a) { char t[1024]; return start_(d, message_of(a, t, sizeof t)); }
static void DomainRangeEnd(const char *d, uint64_t id) { end_(d, id); }
static void DomainMarkEx(const char *d, const EventAttributes *a) { char t[1024]; emit("mark", d, 0, message_of(a, t, sizeof t)); }
static const char *DomainRegisterStringA(const char *d, const char *s) { (void)d; return strdup(s ? s : ""); }
static const char *DomainRegisterStringW(const char *d, const wchar_t *s) { char t[1024]; (void)d; return strdup(narrow(s, t, sizeof t)); }
static const char *DomainCreateA(const char *name) { return strdup(name ? name : "(unnamed)"); }
static const char *DomainCreateW(const wchar_t *name) { char t[1024]; return name ? strdup(narrow(name, t, sizeof t)) : DomainCreateA(NULL); }

static void install(NvtxFunctionTable table, unsigned int size, unsigned int id, void *fn)
{
    if (table && id < size && table[id]) *table[id] = (NvtxFunctionPointer)fn;
}

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    int (*first)(NvtxGetExportTableFunc_t) = (int (*)(NvtxGetExportTableFunc_t))first_copy("InitializeInjectionNvtx2");
    if (passive()) return first ? first(getExportTable) : 0;  /* NVTX picked a later copy: the first fills the tables */
    const char *depth = getenv("PCIETRACE_MAX_DEPTH");  /* (1..PT_MAX_DEPTH; anything else: every range) */
    char *end = NULL;
    long limit = depth ? strtol(depth, &end, 10) : 0;
    if (depth && *depth && end && !*end && limit >= 1 && limit <= PT_MAX_DEPTH) g_max_depth = (int)limit;
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable t = NULL;
    unsigned int n = 0;
    if (!cb || !cb->GetModuleFunctionTable) return 0;
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &t, &n)) {
        install(t, n, CORE_MarkEx, (void *)MarkEx); install(t, n, CORE_MarkA, (void *)MarkA);
        install(t, n, CORE_RangeStartEx, (void *)RangeStartEx); install(t, n, CORE_RangeStartA, (void *)RangeStartA);
        install(t, n, CORE_RangeEnd, (void *)RangeEnd); install(t, n, CORE_RangePushEx, (void *)RangePushEx);
        install(t, n, CORE_RangePushA, (void *)RangePushA); install(t, n, CORE_RangePop, (void *)RangePop);
        install(t, n, CORE_MarkW, (void *)MarkW); install(t, n, CORE_RangeStartW, (void *)RangeStartW);
        install(t, n, CORE_RangePushW, (void *)RangePushW);
    }
    if (cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) {
        install(t, n, CORE2_DomainMarkEx, (void *)DomainMarkEx); install(t, n, CORE2_DomainRangeStartEx, (void *)DomainRangeStartEx);
        install(t, n, CORE2_DomainRangeEnd, (void *)DomainRangeEnd); install(t, n, CORE2_DomainRangePushEx, (void *)DomainRangePushEx);
        install(t, n, CORE2_DomainRangePop, (void *)DomainRangePop);
        install(t, n, CORE2_DomainRegisterStringA, (void *)DomainRegisterStringA);
        install(t, n, CORE2_DomainCreateA, (void *)DomainCreateA);
        install(t, n, CORE2_DomainRegisterStringW, (void *)DomainRegisterStringW);
        install(t, n, CORE2_DomainCreateW, (void *)DomainCreateW);
    }
    emit("nvtx", NULL, 0, "injection initialised");
    return 1;
}
