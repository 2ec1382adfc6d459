/*
 * profile.h — --profile: a trace of chosen training steps, in Chrome's trace-event JSON (Perfetto and
 * chrome://tracing open it; README.md, "Profiling"). The step and the models mark ranges where they
 * begin and end:
 *   prof_begin(track, cat, fmt, ...)   prof_end(track)   prof_next(track, cat, fmt, ...) (end, then begin)
 * on a track: PROF_HOST, this thread's wall clock (the CPU backend, data loading, the host's share of a
 * GPU step), or prof_stream(s, name), a CUDA stream: a pair of events recorded on s (the device's time
 * of the work between them), plus an NVTX range of the same name so that nsys shows it
 * (model/platform.h; nothing under the emulator). Ranges on one track nest.
 *
 * Cost when off (no --profile, or a step outside --profile-steps): every call returns at its first
 * test; no event, no launch, no synchronisation. When on, the steps only record events; they are read
 * once, after the last profiled step (one synchronisation, outside the steps): a profiled step keeps the
 * launches, copies and synchronisations of an unprofiled one (test/test_profile.sh compares the
 * emulator's counters).
 *
 * Time base: the host's CLOCK_MONOTONIC (now_seconds), in microseconds, so that the ranks of one node
 * line up. A device range is placed on it by a reference event, recorded in each traced step on the null
 * stream (the model's) at a known host time, when the step's first device range begins (the step begins
 * with a synchronisation: the device is idle then), and cudaEventElapsedTime from it (float
 * milliseconds: a reference per step keeps them short).
 * Under the emulator the ranges also go to the work log (SIMT_WORKLOG): make predict TRACE=FILE puts them,
 * with the same names, on the predicted GPU timeline (dev/predict/README.md).
 * The callers name their ranges (the store's collectives too): nothing of parallel/ is named here.
 */
#pragma once
#include <string>
#include <vector>
#include "common.h"
#if DBRX_HAVE_CUDA
#include "cuda_common.h"
#endif

// where a range is timed: device 0, the host's clock; 1, events on `stream` (a cudaStream_t), which the
// trace calls `name`
typedef struct { int device; void* stream; const char* name; } ProfTrack;
#define PROF_HOST (ProfTrack{0, nullptr, "host"})
#if DBRX_HAVE_CUDA
static inline ProfTrack prof_stream(cudaStream_t s, const char* name) { return ProfTrack{1, (void*)s, name}; }
#endif

typedef struct {
    std::string name;
    const char* cat;        // "step", "phase", "layer", "comm", "eval", "io"
    int tid, step;          // its track; the step (1-based) it was recorded in
    int ref;                // a device range's reference event (Profiler.refs)
    double t0, t1;          // seconds, host clock (a device range's: from its events, at the read-back)
    void *e0, *e1;          // a device range's cudaEvent_t pair
    uint64_t nvtx;          // its NVTX range (nvcc build)
} ProfRange;

typedef struct {
    int first, last;                         // the profiled steps, 1-based, inclusive (0: --profile not given)
    int step;                                // the step being recorded (0: none)
    std::vector<ProfRange> ranges;
    std::vector<ProfTrack> tracks;           // by tid: 0 the host, then each stream in order of first use
    std::vector<std::vector<size_t>> open;   // by tid: the open ranges, innermost last
    std::vector<void*> refs;                 // the reference events (cudaEvent_t), one per traced step with device ranges,
    std::vector<double> refs_t;              // recorded at these host times
    int ref_step;                            // the step of the last reference
    bool read;                               // the device ranges have their times
    bool kernels;                            // --profile-kernels: every launch and GEMM a range (cat "kernel")
} Profiler;

inline Profiler g_prof;

static inline void prof_init(int first, int last, bool kernels = false) {
    g_prof = Profiler();
    g_prof.first = first;
    g_prof.last = last;
    g_prof.kernels = kernels;
    g_prof.tracks = {PROF_HOST};
    g_prof.open.resize(1);
}
#if DBRX_HAVE_CUDA
static inline void prof_kernel_hook(const char* name, cudaStream_t stream, bool end);
#endif
// the training loop's iteration for step (1-based) begins: record it if it is one of --profile-steps (and with
// --profile-kernels, its launches: the hook on for exactly the profiled steps)
static inline void prof_step_begin(int step) {
    g_prof.step = g_prof.first > 0 && step >= g_prof.first && step <= g_prof.last ? step : 0;
#if DBRX_HAVE_CUDA
    g_launch_hook = g_prof.step && g_prof.kernels ? prof_kernel_hook : nullptr;
#endif
}
static inline bool prof_on() { return g_prof.step > 0; }

static inline int prof_tid(ProfTrack t) {
    if (!t.device) return 0;
    for (size_t i = 1; i < g_prof.tracks.size(); i++)
        if (g_prof.tracks[i].device && g_prof.tracks[i].stream == t.stream) return (int)i;
    g_prof.tracks.push_back(t);
    g_prof.open.emplace_back();
    return (int)g_prof.tracks.size() - 1;
}

static inline void prof_begin_v(ProfTrack t, const char* cat, const char* fmt, va_list ap) {
    char name[160];
    vsnprintf(name, sizeof name, fmt, ap);
    ProfRange r = {name, cat, prof_tid(t), g_prof.step, -1, now_seconds(), 0, nullptr, nullptr, 0};
#if DBRX_HAVE_CUDA
    if (t.device) {
        cudaStream_t s = (cudaStream_t)t.stream;
        cudaEvent_t e0, e1;
        if (g_prof.ref_step != g_prof.step) {   // this step's time base (see the top), on the model's stream
            cudaCheck(cudaEventCreate(&e0));
            cudaCheck(cudaEventRecord(e0, 0));
            g_prof.refs_t.push_back(now_seconds());
            g_prof.refs.push_back((void*)e0);
            g_prof.ref_step = g_prof.step;
        }
        r.ref = (int)g_prof.refs.size() - 1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        cudaCheck(cudaEventRecord(e0, s));
        r.e0 = (void*)e0;
        r.e1 = (void*)e1;
    }
    r.nvtx = platform_nvtx_start(name);
    platform_worklog_range(name, true, t.stream, t.device);
#endif
    g_prof.open[r.tid].push_back(g_prof.ranges.size());
    g_prof.ranges.push_back(r);
}

static inline void prof_begin(ProfTrack t, const char* cat, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void prof_begin(ProfTrack t, const char* cat, const char* fmt, ...) {
    if (!g_prof.step) return;
    va_list ap;
    va_start(ap, fmt);
    prof_begin_v(t, cat, fmt, ap);
    va_end(ap);
}

static inline void prof_end(ProfTrack t) {
    if (!g_prof.step) return;
    std::vector<size_t>& open = g_prof.open[prof_tid(t)];
    ENSURE(!open.empty(), "prof_end on track %s: no range is open", t.name);
    ProfRange& r = g_prof.ranges[open.back()];
    open.pop_back();
#if DBRX_HAVE_CUDA
    if (t.device) cudaCheck(cudaEventRecord((cudaEvent_t)r.e1, (cudaStream_t)t.stream));
    platform_nvtx_end(r.nvtx);
    platform_worklog_range(r.name.c_str(), false, t.stream, t.device);
#endif
    r.t1 = now_seconds();
}

// ends the innermost range of the track and begins the next one
static inline void prof_next(ProfTrack t, const char* cat, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void prof_next(ProfTrack t, const char* cat, const char* fmt, ...) {
    if (!g_prof.step) return;
    prof_end(t);
    va_list ap;
    va_start(ap, fmt);
    prof_begin_v(t, cat, fmt, ap);
    va_end(ap);
}

#if DBRX_HAVE_CUDA
// --profile-kernels (model/platform.h's launch hook): each launch and GEMM of a profiled step as a range of category
// "kernel" on its stream's track, named as launched ("swiglu_forward_kernel<8>") or by the GEMM's shape key ("gemm m n
// k batch a b d ta tb beta fast modes", dev/cuda/matmul -s's); its device time is its pair of events. The events add a
// few microseconds of host time per launch: the kernels' times are what to read, not the step's (which may grow where
// the host issues short kernels one after another).
static inline void prof_kernel_hook(const char* name, cudaStream_t stream, bool end) {
    ProfTrack t = prof_stream(stream, "CUDA stream: kernels");
    if (end) prof_end(t);
    else prof_begin(t, "kernel", "%s", name);
}
#endif

// a host range already timed (t0, t1: now_seconds): the step's own range, exactly the time the log prints
static inline void prof_host_range(const char* cat, double t0, double t1, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static inline void prof_host_range(const char* cat, double t0, double t1, const char* fmt, ...) {
    if (!g_prof.step) return;
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    g_prof.ranges.push_back(ProfRange{name, cat, 0, g_prof.step, -1, t0, t1, nullptr, nullptr, 0});
}

// After the last profiled step: the device ranges' times from their events, and the events released.
// Its one synchronisation waits for what the iteration issued after the step's own closing one (a
// sample's gathers, say); it is the only one --profile adds, and it is outside every step.
static inline void prof_read_device() {
    if (g_prof.read) return;
    g_prof.read = true;
#if DBRX_HAVE_CUDA
    if (g_prof.refs.empty()) return;   // no device range (the CPU backend: no CUDA call at all)
    cudaCheck(cudaDeviceSynchronize());
    for (ProfRange& r : g_prof.ranges) {
        if (!r.e0) continue;
        cudaEvent_t ref = (cudaEvent_t)g_prof.refs[r.ref];
        float ms0, ms1;
        cudaCheck(cudaEventElapsedTime(&ms0, ref, (cudaEvent_t)r.e0));
        cudaCheck(cudaEventElapsedTime(&ms1, ref, (cudaEvent_t)r.e1));
        r.t0 = g_prof.refs_t[r.ref] + ms0 * 1e-3;
        r.t1 = g_prof.refs_t[r.ref] + ms1 * 1e-3;
        cudaCheck(cudaEventDestroy((cudaEvent_t)r.e0));
        cudaCheck(cudaEventDestroy((cudaEvent_t)r.e1));
        r.e0 = r.e1 = nullptr;
    }
    for (void* e : g_prof.refs) cudaCheck(cudaEventDestroy((cudaEvent_t)e));
    g_prof.refs.clear();
#endif
}

// a name as a JSON string (the names are the callers' own: quotes and backslashes are all there is to escape)
static inline std::string prof_json_str(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += (unsigned char)c < 0x20 ? ' ' : c;
    }
    return o + "\"";
}

// The trace of this rank (pid = rank; tid = track): metadata events naming the process and its tracks,
// then one complete event ("ph": "X", ts and dur in microseconds) per range
static inline std::string prof_trace_json(int rank, int world) {
    prof_read_device();
    std::string o = "{\"traceEvents\": [\n";
    char b[512];
    auto meta = [&](const char* what, int tid, const std::string& name) {
        snprintf(b, sizeof b, "{\"name\": \"%s\", \"ph\": \"M\", \"ts\": 0, \"dur\": 0, \"pid\": %d, \"tid\": %d, \"args\": {\"name\": %s}},\n",
                 what, rank, tid, prof_json_str(name).c_str());
        o += b;
    };
    meta("process_name", 0, "rank " + std::to_string(rank) + " of " + std::to_string(world));
    for (size_t t = 0; t < g_prof.tracks.size(); t++)
        meta("thread_name", (int)t, t == 0 ? std::string("host (wall clock)") : std::string("CUDA stream: ") + g_prof.tracks[t].name);
    for (size_t i = 0; i < g_prof.ranges.size(); i++) {
        const ProfRange& r = g_prof.ranges[i];
        snprintf(b, sizeof b, "{\"name\": %s, \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"step\": %d}}%s\n", prof_json_str(r.name).c_str(), r.cat, r.t0 * 1e6, (r.t1 - r.t0) * 1e6, rank, r.tid,
                 r.step, i + 1 < g_prof.ranges.size() ? "," : "");
        o += b;
    }
    if (g_prof.ranges.empty()) {   // (no comma after the last metadata event)
        o.resize(o.size() - 2);
        o += "\n";
    }
    snprintf(b, sizeof b, "], \"displayTimeUnit\": \"ms\", \"otherData\": {\"profiled_steps\": \"%d:%d\", \"clock\": "
             "\"CLOCK_MONOTONIC, microseconds\"}}\n", g_prof.first, g_prof.last);
    return o + b;
}
