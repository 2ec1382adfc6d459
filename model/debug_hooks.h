/*
 * debug_hooks.h — the tests' fault-injection switches, read from the environment ONCE at start-up
 * (debug_hooks_read, called by main) into one struct, g_debug_hooks, that the few places acting on them
 * consult. Nothing else in the product calls getenv for a DBRX_DEBUG_* variable, and nothing on a hot
 * path reads the environment. A malformed value is one line naming the variable, exit 2.
 *
 * DEBUG_HOOK_DOCS below lists them, with their values and effects: `train_dbrx --help-debug` prints it, and
 * debug_hooks_read reads a variable only through debug_env, which refuses a name the table lacks, so that
 * the list cannot drift from what is read.
 */
#pragma once
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include "common.h"

typedef enum { PLANT_NONE = 0, PLANT_STEP_SYNC, PLANT_REDUCE_SCATTER_CHUNK, PLANT_SKIP_GATHER_WAIT, PLANT_FP8_GATHER_SCALE,
               PLANT_EP_REGROW, PLANT_COMM_SERIAL, PLANT_COMM_REORDER, PLANT_RECOMPUTE_ROUTING,
               PLANT_CHUNK_EARLY_RS, PLANT_CP_ALL_GATHER, PLANT_NO_RC_PREFETCH,
               PLANT_NO_HEAD_AHEAD, PLANT_STALE_GRAD, PLANT_EMB_SUM_ORDER, PLANT_REPLICA_AT_END,
               PLANT_EXPERTS_NO_JOIN } DebugPlant;

typedef struct {
    int kill_rank = -1, kill_step = -1, kill_signal = SIGKILL;
    int spike_step = -1;             // < 1: no spike
    bool spike_from = false;         // every step from spike_step on
    float spike_factor = 1;
    int slow_rank = -1, slow_ms = 0;
    int slow_gemm_rank = -1, slow_gemm_factor = 8;
    bool route_first = false;
    bool route_balanced = false;
    int ckpt_kill_step = -1;
    std::string ckpt_kill_point;
    bool twin_blocks = false;
    int ep_grow_fail = -1;           // the EP rank whose growth of its buffers fails (expert_parallel_grow.cuh)
    DebugPlant plant = PLANT_NONE;
} DebugHooks;

inline DebugHooks g_debug_hooks;   // (all off until debug_hooks_read)

// every switch: the variable, its value, what it does (--help-debug prints this table)
typedef struct { const char* name; const char* value; const char* help; } DebugHookDoc;
static const DebugHookDoc DEBUG_HOOK_DOCS[] = {
    {"DBRX_DEBUG_KILL", "R:S[:stop]", "rank R SIGKILLs (\":stop\": SIGSTOPs) itself in the middle of step S (a lost or hung rank)"},
    {"DBRX_DEBUG_SPIKE", "S[+]:F", "the gradients of step S (with \"+\": of every step from S on) times F (a spike; F = nan: a NaN step)"},
    {"DBRX_DEBUG_SLOW_RANK", "R:MS", "rank R sleeps MS ms in every step (a straggler)"},
    {"DBRX_DEBUG_SLOW_GEMM", "R[:F]", "the health check: rank R's GEMM does F (8) GEMMs for every one it counts (a slow GPU)"},
    {"DBRX_DEBUG_ROUTE_FIRST", "1", "every token routed to experts 0..k-1 (a forced expert imbalance)"},
    {"DBRX_DEBUG_ROUTE_BALANCED", "1", "token t routed to experts (k t + j) mod E, j < k: every expert takes N k / E rows where E divides N k "
                                       "(the step-time model's balanced routing, for benchmarks: a router collapsed at initialisation "
                                       "gives the expert GEMMs other shapes)"},
    {"DBRX_DEBUG_CKPT_KILL", "S:POINT", "SIGKILL at POINT (shard | manifest | rename) of step S's checkpoint save"},
    {"DBRX_DEBUG_EP_GROW_FAIL", "R", "expert parallelism on the GPU: EP rank R cannot allocate when a routing outgrows the buffers "
                                    "(out of device memory: every rank of its EP group stops with one message)"},
    {"DBRX_DEBUG_TWIN_BLOCKS", "1", "the NCCL twin's waits have no watchdog (a stuck collective blocks; emulated builds)"},
    {"DBRX_DEBUG_PLANT", "NAME", "a planted bug, the negative control of a test: step_sync (one more synchronisation per layer), "
                                 "reduce_scatter_chunk, skip_gather_wait, fp8_gather_scale, serial_streams (gathers wait for the reduce-scatters), "
                                 "reorder_issue (world rank 1 issues its communicators in another order) (ZeRO-3 on the GPU), ep_regrow (one EP "
                                 "buffer freed and allocated again in every step: no-allocation test), recompute_routing (--recompute "
                                 "moe/block: the recomputation swaps two routed rows), chunk_early_rs (--zero-chunk-mib: an experts chunk's gradient "
                                 "reduce-scattered before its backward), cp_all_gather (--context-parallel: the former forms, "
                                 "the same numbers: on the GPU K|V all-gathered, on the CPU the ring's K|V hops blocking), no_rc_prefetch (--recompute moe/block under ZeRO-3: the recompute's "
                                 "block gathered when it begins, not ahead), "
                                 "no_head_ahead (the vocabulary slot under ZeRO-3 on the GPU: the head gathered by the last block's prefetch, not "
                                 "after the embedding's forward), stale_grad (the GPU's gradient overwritten, not zeroed: under ZeRO-3 unit 1's "
                                 "first reduce-scatter of a step, on one GPU lm_head's first weight gradient, adds to the previous step's instead), "
                                 "emb_sum_order (--zero-embedding rows: an owner sums the gradient rows in rank order 0, 1, ..., not the "
                                 "reduce-scatter's), replica_at_end (HSDP on the GPU: the gradient shard summed over the replicas "
                                 "at once after the backward, not unit by unit beside it), experts_no_join (--moe-streams 2: the model's stream does not wait "
                                 "for the side stream's expert GEMMs)"},
};

// getenv of a switch the table lists (any other name is a programming error: exit 1 at start-up)
static inline const char* debug_env(const char* name) {
    for (const DebugHookDoc& d : DEBUG_HOOK_DOCS)
        if (!strcmp(d.name, name)) return getenv(name);
    fail(EXIT_RUNTIME, "model/debug_hooks.h: %s is read but not in DEBUG_HOOK_DOCS (--help-debug)", name);
}

// --help-debug
static inline void debug_hooks_print() {
    printf("test and fault-injection switches (environment variables, read once at start-up; test/README.md):\n");
    for (const DebugHookDoc& d : DEBUG_HOOK_DOCS) {
        std::string left = std::string(d.name) + "=" + d.value;
        printf("  %-32s %s\n", left.c_str(), d.help);
    }
}

// parses every DBRX_DEBUG_* variable into g_debug_hooks (a test that sets one later calls it again)
static inline void debug_hooks_read() {
    DebugHooks h;
    if (const char* k = debug_env("DBRX_DEBUG_KILL")) {
        if (sscanf(k, "%d:%d", &h.kill_rank, &h.kill_step) != 2) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_KILL '%s' is not R:S[:stop]", k);
        if (strstr(k, ":stop")) h.kill_signal = SIGSTOP;
    }
    if (const char* k = debug_env("DBRX_DEBUG_SPIKE")) {
        char* end = NULL;
        h.spike_step = (int)strtol(k, &end, 10);
        h.spike_from = *end == '+';
        if (h.spike_from) end++;
        if (*end != ':' || h.spike_step < 1) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_SPIKE '%s' is not STEP[+]:FACTOR", k);
        h.spike_factor = strtof(end + 1, NULL);
    }
    if (const char* k = debug_env("DBRX_DEBUG_SLOW_RANK"))
        if (sscanf(k, "%d:%d", &h.slow_rank, &h.slow_ms) != 2) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_SLOW_RANK '%s' is not R:MS", k);
    if (const char* s = debug_env("DBRX_DEBUG_SLOW_GEMM")) {
        char* end = NULL;
        long r = strtol(s, &end, 10), f = 8;
        if (*end == ':') { char* e2 = NULL; f = strtol(end + 1, &e2, 10); end = (e2 == end + 1) ? end : e2; }
        if (!*s || *end || r < 0 || r > 1000000 || f < 1 || f > 1000) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_SLOW_GEMM '%s' is not R[:F]", s);
        h.slow_gemm_rank = (int)r;
        h.slow_gemm_factor = (int)f;
    }
    h.route_first = debug_env("DBRX_DEBUG_ROUTE_FIRST") != NULL;
    h.route_balanced = debug_env("DBRX_DEBUG_ROUTE_BALANCED") != NULL;
    if (h.route_first && h.route_balanced) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_ROUTE_FIRST and DBRX_DEBUG_ROUTE_BALANCED are exclusive");
    if (const char* k = debug_env("DBRX_DEBUG_CKPT_KILL")) {
        char point[32] = "";
        if (sscanf(k, "%d:%31s", &h.ckpt_kill_step, point) != 2)
            fail(EXIT_BAD_INPUT, "DBRX_DEBUG_CKPT_KILL '%s' is not STEP:shard|manifest|rename", k);
        h.ckpt_kill_point = point;
    }
    h.twin_blocks = debug_env("DBRX_DEBUG_TWIN_BLOCKS") != NULL;
    if (const char* k = debug_env("DBRX_DEBUG_EP_GROW_FAIL"))
        if (sscanf(k, "%d", &h.ep_grow_fail) != 1 || h.ep_grow_fail < 0) fail(EXIT_BAD_INPUT, "DBRX_DEBUG_EP_GROW_FAIL '%s' is not an EP rank", k);
    if (const char* p = debug_env("DBRX_DEBUG_PLANT")) {
        h.plant = !strcmp(p, "step_sync") ? PLANT_STEP_SYNC : !strcmp(p, "reduce_scatter_chunk") ? PLANT_REDUCE_SCATTER_CHUNK
                : !strcmp(p, "skip_gather_wait") ? PLANT_SKIP_GATHER_WAIT : !strcmp(p, "fp8_gather_scale") ? PLANT_FP8_GATHER_SCALE
                : !strcmp(p, "ep_regrow") ? PLANT_EP_REGROW
                : !strcmp(p, "serial_streams") ? PLANT_COMM_SERIAL : !strcmp(p, "reorder_issue") ? PLANT_COMM_REORDER
                : !strcmp(p, "recompute_routing") ? PLANT_RECOMPUTE_ROUTING : !strcmp(p, "chunk_early_rs") ? PLANT_CHUNK_EARLY_RS
                : !strcmp(p, "cp_all_gather") ? PLANT_CP_ALL_GATHER : !strcmp(p, "no_rc_prefetch") ? PLANT_NO_RC_PREFETCH
                : !strcmp(p, "no_head_ahead") ? PLANT_NO_HEAD_AHEAD : !strcmp(p, "stale_grad") ? PLANT_STALE_GRAD
                : !strcmp(p, "emb_sum_order") ? PLANT_EMB_SUM_ORDER : !strcmp(p, "replica_at_end") ? PLANT_REPLICA_AT_END
                : !strcmp(p, "experts_no_join") ? PLANT_EXPERTS_NO_JOIN : PLANT_NONE;
        if (h.plant == PLANT_NONE)
            fail(EXIT_BAD_INPUT, "DBRX_DEBUG_PLANT '%s' is not step_sync, reduce_scatter_chunk, skip_gather_wait, fp8_gather_scale, "
                 "ep_regrow, serial_streams, reorder_issue, recompute_routing, chunk_early_rs, cp_all_gather, no_rc_prefetch "
                 "no_head_ahead, stale_grad, emb_sum_order, replica_at_end or experts_no_join", p);
    }
    g_debug_hooks = h;
}

// the training step's seams (train_step.h), after each micro-batch's forward of step (1-based) `step`:
// the killed or stopped rank, and the slow one
static inline void debug_after_forward(int rank, int step) {
    const DebugHooks& h = g_debug_hooks;
    if (rank == h.kill_rank && step == h.kill_step) raise(h.kill_signal);
    if (rank == h.slow_rank) usleep(h.slow_ms * 1000);
}
// whether step (1-based) `step`'s gradients are multiplied by *factor (a spike, or nan)
static inline bool debug_spike(int step, float* factor) {
    const DebugHooks& h = g_debug_hooks;
    *factor = h.spike_factor;
    return h.spike_step > 0 && (step == h.spike_step || (h.spike_from && step > h.spike_step));
}
// checkpoint/ckpt.h's seam: SIGKILL at `point` (shard, manifest, rename) of step `step`'s save
static inline void debug_ckpt_kill(int step, const char* point) {
    const DebugHooks& h = g_debug_hooks;
    if (step == h.ckpt_kill_step && h.ckpt_kill_point == point) {
        fprintf(stderr, "debug: SIGKILL during the save of step %d (%s)\n", step, point);
        fflush(stderr);
        raise(SIGKILL);
    }
}
