/*
 * The contract between the injection library (pt_inject*.c) and pcietrace's Python side: what each writes and
 * the other reads. Change a value here only together with its Python twin, named beside it; tests/test_abi.py
 * checks that they agree and that a library built from these sources exports PT_ABI_VERSION.
 */
#pragma once
#include <stdint.h>

/* The library's interface version, exported as ``pcietrace_inject_abi`` (an unsigned int) and as the string
 * PT_ABI_TAG; pcietrace.record.trace.INJECT_ABI is the version the Python side expects, and attach refuses a
 * library built from other sources. Raise it whenever anything below changes meaning. */
#define PT_ABI_VERSION 5
#define PT_ABI_STR_(x) #x
#define PT_ABI_STR(x) PT_ABI_STR_(x)
#define PT_ABI_TAG "pcietrace-inject-abi " PT_ABI_STR(PT_ABI_VERSION)

/* The edge page (PCIETRACE_EDGE_FILE, one page shared by the program and the samplers): 32-bit words, by index
 * (collectors/edges.py: SEQ, OPEN_RANGES, FORCE_FAST, COUNTING, WAKES, PAGE). */
#define PT_EDGE_SEQ 0          /* range edges so far (modulo 2**32) */
#define PT_EDGE_OPEN_RANGES 1  /* threads with a push range open, plus start ranges open, now; never below 0 */
#define PT_EDGE_FORCE_FAST 2   /* pcietrace's own: the recording process wants the fast rate with no range open */
#define PT_EDGE_COUNTING 3     /* set by a library that keeps word 1 when it maps the page */
#define PT_EDGE_WAKES 4        /* edges that woke the samplers so far (modulo 2**32); the futex they wait on */
#define PT_EDGE_PAGE_BYTES 4096

/* Each trace file (PCIETRACE_TRACE_DIR/trace-<pid>.bin) is a sparse file of three parts, written through one
 * MAP_SHARED mapping by the program's own threads (so what was written survives a crash of the program):
 *   the header (PT_TRACE_HEADER_BYTES): struct pt_trace_header, whose first line is
 *     PT_TRACE_MAGIC " " PT_TRACE_VERSION "\n" (NUL-padded), then where the other two parts lie and how much of
 *     each the writers have taken so far (taken atomically: a reader after a crash knows how far to look);
 *   the events: struct pt_event records, back to back; a record is whole once its ``commit`` byte is 1 (set last);
 *     each thread takes them (and the strings) a block at a time, so records it never wrote lie among them, zero;
 *   the strings: each event's name, domain and message, back to back from its ``str_at`` (no terminators).
 * Python's twin: pcietrace.record.trace (TRACE_MAGIC, TRACE_VERSION, HEADER_DTYPE, EVENT_DTYPE). Text traces
 * (trace-<pid>.tsv, versions 1-4) of older libraries are still read. */
#define PT_TRACE_MAGIC "#pcietrace-trace"
#define PT_TRACE_VERSION 5
#define PT_TRACE_HEADER_BYTES 4096

struct pt_trace_header {
    char line[64];              /* the version line */
    uint64_t events_at;         /* file offset of the events part */
    uint64_t events_cap;        /* its bytes (a multiple of sizeof(struct pt_event)); its last record is kept
                                   for the "tracefull" event */
    uint64_t strings_at;        /* file offset of the strings part */
    uint64_t strings_cap;       /* its bytes; its last PT_TRACE_RESERVE are kept for the "tracefull" event */
    uint64_t events_taken;      /* bytes of the events part taken so far (may pass events_cap once it is full) */
    uint64_t strings_taken;     /* the same for the strings part */
    uint64_t timed_edges;       /* range edges (push, pop, start, end) the library timed itself: one in
                                   PT_EDGE_TIMED_EVERY of each thread's */
    uint64_t timed_ns;          /* the ns those spent in the library, in the program's threads */
    uint64_t unrecorded_ranges; /* push ranges opened PCIETRACE_MAX_DEPTH or more deep, not recorded (0 in traces
                                   of libraries before it: the header's unused bytes are zero) */
};
/* PCIETRACE_MAX_DEPTH's largest value (attach --max-depth; pcietrace.config.MAX_DEPTH). */
#define PT_MAX_DEPTH 4096
/* One range edge in this many of each thread's is timed (odd: a thread whose edges alternate push and pop has
 * both timed). */
#define PT_EDGE_TIMED_EVERY 61

struct pt_event {
    uint64_t t_ns;              /* CLOCK_MONOTONIC */
    uint64_t id;
    uint64_t eager_thread, graph_thread, eager_process, graph_process;
    uint64_t devmask;           /* CUDA ordinals the thread launched or copied on since its previous event */
    uint64_t captured_thread, captured_process;
    int64_t call_ns_thread, call_ns_process, wait_ns_thread, wait_ns_process;  /* -1: not timed */
    uint64_t str_at;            /* its strings' offset in the strings part */
    int32_t tid, depth;
    int16_t dev;                /* the CUDA ordinal current on the thread (-1: none) */
    uint16_t message_bytes;
    uint8_t event_bytes, domain_bytes, reserved, commit;
};
_Static_assert(sizeof(struct pt_event) == 128, "struct pt_event is 128 bytes: EVENT_DTYPE's itemsize");

/* Bytes kept free at the end of the strings part for the "tracefull" event's strings (TRACE_RESERVE_BYTES). */
#define PT_TRACE_RESERVE 256
