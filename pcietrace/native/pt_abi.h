/*
 * The contract between the injection library (pt_inject*.c) and pcietrace's Python side: what each writes and
 * the other reads. Change a value here only together with its Python twin, named beside it; tests/test_abi.py
 * checks that they agree and that a library built from these sources exports PT_ABI_VERSION.
 */
#pragma once

/* The library's interface version, exported as ``pcietrace_inject_abi`` (an unsigned int) and as the string
 * PT_ABI_TAG; pcietrace.record.attach.INJECT_ABI is the version the Python side expects, and attach refuses a
 * library built from other sources. Raise it whenever anything below changes meaning. */
#define PT_ABI_VERSION 1
#define PT_ABI_STR_(x) #x
#define PT_ABI_STR(x) PT_ABI_STR_(x)
#define PT_ABI_TAG "pcietrace-inject-abi " PT_ABI_STR(PT_ABI_VERSION)

/* The edge page (PCIETRACE_EDGE_FILE, one page shared by the program and the samplers): 32-bit words, by index
 * (collectors/edges.py: SEQ, OPEN_RANGES, FORCE_FAST, COUNTING, PAGE). */
#define PT_EDGE_SEQ 0          /* range edges so far (modulo 2**32); the futex the samplers wait on */
#define PT_EDGE_OPEN_RANGES 1  /* ranges open now over every traced process and thread, never below 0 */
#define PT_EDGE_FORCE_FAST 2   /* pcietrace's own: the recording process wants the fast rate with no range open */
#define PT_EDGE_COUNTING 3     /* set by a library that keeps word 1 when it maps the page */
#define PT_EDGE_PAGE_BYTES 4096

/* Each trace file (PCIETRACE_TRACE_DIR/trace-<pid>.tsv) begins with the line
 *   PT_TRACE_MAGIC " " PT_TRACE_VERSION "\n"
 * then one tab-separated line per event, with the fields of that version (pcietrace.record.attach:
 * TRACE_MAGIC, TRACE_COLUMNS). Traces of older libraries have no such line; their version is told by their
 * field count. */
#define PT_TRACE_MAGIC "#pcietrace-trace"
#define PT_TRACE_VERSION 4
/* Bytes kept free at the end of a trace file for its "tracefull" line (TRACE_RESERVE_BYTES). */
#define PT_TRACE_RESERVE 256
