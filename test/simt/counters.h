/*
 * counters.h — what the emulated runtime saw the host ask of the "device": the numbers a step's
 * budget is written in (model/CUDA.md, "Host round trips"). Counted where the host issues the call,
 * not where a deferred stream runs it:
 *   launches        kernels through LAUNCH (simt::launch)
 *   gemms           cuBLASLt matmuls (the twin, test/simt/cublaslt_api_twin.h): a GPU launches >= 1 kernel each
 *   syncs           calls that make the host wait for the device: cudaStreamSynchronize,
 *                   cudaDeviceSynchronize, cudaEventSynchronize, and every blocking cudaMemcpy (it
 *                   waits for the work issued before it, as on a GPU)
 *   h2d/d2h         bytes and copies, blocking or not (cudaMemcpy and cudaMemcpyAsync by their kind)
 *   heuristic_queries, plan_creations   the cuBLASLt plan cache (model/matmul.cuh): heuristic calls
 *                   and descriptor sets made (steady-state steps make none)
 *   allocs/frees    cudaMalloc and cudaMallocHost / cudaFree and cudaFreeHost calls that succeeded (on a GPU
 *                   both can synchronise the device: steady-state steps make none, model/CUDA.md)
 * simt::counters() reads them, simt::counters_reset() zeroes them. Host-side only, one process;
 * relaxed atomic additions (a helper thread, such as the communication watchdog, may copy too).
 * The same calls feed the work log (SIMT_WORKLOG=FILE, below): every item one line, for the step-time model.
 * Included by simt.h after the CUDA runtime's types (dim3).
 */
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

namespace simt {
struct Counters {
    long long launches, gemms, syncs;
    long long h2d_bytes, d2h_bytes, h2d_copies, d2h_copies;
    long long heuristic_queries, plan_creations;
    long long allocs, frees;
};
inline Counters& counters() { static Counters c = {}; return c; }
inline void counters_reset() { counters() = Counters{}; }
inline void count(long long* field, long long v = 1) { __atomic_add_fetch(field, v, __ATOMIC_RELAXED); }
// The emulated device memory at its highest (bytes cudaMalloc'd and not yet freed) since the start or the
// last peak_device_bytes_reset (simt.h): what the planner's allocations term predicts (parallel/memory_plan.h).
// Kept apart from Counters (counters_reset does not touch it); updated under the runtime's lock by cudaMalloc.
inline size_t& device_peak() { static size_t p = 0; return p; }
inline void device_bytes_note(size_t allocated) { if (allocated > device_peak()) device_peak() = allocated; }

// ---------------------------------------------------------------------------------------------
// The work log (SIMT_WORKLOG=FILE): one JSON line per device-work item, in the order the host issues it,
// for the step-time model (dev/predict/predict.py). Every process writes its own file: FILE, or FILE.<rank>
// under mpirun with more than one rank (OMPI_COMM_WORLD_RANK / _SIZE). Streams and events are numbered in
// the order the log first sees them (stream 0: the null stream). The lines, by "t":
//   kernel  name (LAUNCH's kernel expression), grid, block, smem, stream, args: the kernel's arguments after
//           conversion to its parameter types (integers and floats by value, pointers as true / false for
//           non-null / null, a struct with a worklog_fields() overload as the array it returns, anything else
//           null): the predictor's per-kernel byte formulas read them
//   gemm    m, n, k, batch, a/b/d types, trans_a, trans_b, beta (C read when non-zero), fast_accum,
//           scale modes, epilogue (always "none": the project's GEMMs have none), stream, flops = 2 m n k batch
//   coll    kind (all_gather, reduce_scatter, all_reduce, broadcast, send, recv), comm (its name), nranks,
//           world_ranks, count, elem_bytes, bytes (nccl-tests' size: the gathered / scattered whole for
//           all_gather / reduce_scatter, the buffer for the others), rank (in comm), peer, group (> 0: inside ncclGroupStart
//           .. End, the group's number), stream
//   record  event, stream          wait  event, stream (the stream waits for the event's last record)
//   sync    what: stream / device / event (the host waits), stream or event
//   copy    kind h2d / d2h / d2d / h2h / memset, bytes, stream, blocking (cudaMemcpy: the host waits too)
//   mark    name, n: the training loop's step boundaries (platform_step_counters at dbrx_sync)
// Items are logged when the host issues them (a deferred stream runs them later), from the issuing thread.
// The instrumented build (-DSIMT_RACE_DETECT) adds to each kernel's line what the launch touched ("rd", "wr",
// "rd_sec", "wr_sec", "mma": test/simt/bytecount.h) when it has run: the lines wait in `held` (in issue order)
// until every kernel line before them has its counts; a kernel that never ran is written without them at exit.
struct WorklogHeld { std::string text; long long kernel; };   // kernel: its number while it waits for counts, else -1
struct Worklog {
    FILE* f = nullptr;
    bool checked = false;
    std::map<const void*, int> streams, events;
    int marks = 0;
    long long kernels = 0;
    std::deque<WorklogHeld> held;
    std::mutex mu;
    ~Worklog() {
        for (const WorklogHeld& h : held) if (f) fprintf(f, "{%s}\n", h.text.c_str());
        if (f) fflush(f);
    }
};
inline Worklog& worklog() { static Worklog w; return w; }
// the open log, or NULL when SIMT_WORKLOG is unset (checked once)
inline FILE* worklog_file() {
    Worklog& w = worklog();
    if (!w.checked) {
        w.checked = true;
        const char* p = getenv("SIMT_WORKLOG");
        if (p && *p) {
            std::string path = p;
            const char* rank = getenv("OMPI_COMM_WORLD_RANK");
            const char* size = getenv("OMPI_COMM_WORLD_SIZE");
            if (rank && size && atoi(size) > 1) path += std::string(".") + rank;
            w.f = fopen(path.c_str(), "w");
            if (!w.f) { fprintf(stderr, "error: SIMT_WORKLOG=%s: cannot open %s for writing\n", p, path.c_str()); exit(2); }
        }
    }
    return w.f;
}
inline int worklog_id(std::map<const void*, int>& ids, const void* p, int first) {
    if (!p) return 0;
    auto it = ids.find(p);
    if (it != ids.end()) return it->second;
    int id = (int)ids.size() + first;
    ids[p] = id;
    return id;
}
inline int worklog_stream(const void* s) { return worklog_id(worklog().streams, s, 1); }
inline int worklog_event(const void* e) { return worklog_id(worklog().events, e, 1); }
inline std::string worklog_fmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string worklog_fmt(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}
// writes the held lines up to the first kernel still waiting for its counts
inline void worklog_flush_held() {
    Worklog& w = worklog();
    bool any = false;
    while (!w.held.empty() && w.held.front().kernel < 0) {
        fprintf(w.f, "{%s}\n", w.held.front().text.c_str());
        w.held.pop_front();
        any = true;
    }
    if (any) fflush(w.f);
}
// writes one line (a JSON object's fields, without the braces); kernel >= 0: a kernel's line, held for its counts
inline void worklog_line(const std::string& fields, long long kernel = -1) {
    FILE* f = worklog_file();
    if (!f) return;
#if defined(SIMT_RACE_DETECT)
    worklog().held.push_back({fields, kernel});
    worklog_flush_held();
#else
    (void)kernel;
    fprintf(f, "{%s}\n", fields.c_str());
    fflush(f);
#endif
}
// kernel number `kernel` has run: its counts join its line
inline void worklog_kernel_done(long long kernel, long long rd, long long wr, long long rd_sec, long long wr_sec, long long mma) {
    if (!worklog_file()) return;
    std::lock_guard<std::mutex> lock(worklog().mu);
    for (WorklogHeld& h : worklog().held)
        if (h.kernel == kernel) {
            h.text += worklog_fmt(",\"rd\":%lld,\"wr\":%lld,\"rd_sec\":%lld,\"wr_sec\":%lld,\"mma\":%lld", rd, wr, rd_sec, wr_sec, mma);
            h.kernel = -1;
        }
    worklog_flush_held();
}
// a struct argument is logged as what `worklog_fields(v)` returns (a JSON array, found by argument-dependent
// lookup: the model declares it next to the struct, for the byte formulas), else as null
template <typename T, typename = void> struct worklog_has_fields : std::false_type {};
template <typename T> struct worklog_has_fields<T, std::void_t<decltype(worklog_fields(std::declval<const T&>()))>> : std::true_type {};
// one kernel argument as JSON (see the top)
template <typename T> inline void worklog_arg(std::string* out, const T& v) {
    if (!out->empty()) *out += ",";
    if constexpr (std::is_same_v<T, bool>) *out += v ? "true" : "false";
    else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) *out += std::to_string((long long)v);
    else if constexpr (std::is_floating_point_v<T>) {   // always with a '.' or an exponent: a reader tells 1.0f from 1
        std::string f = std::isfinite((double)v) ? worklog_fmt("%.9g", (double)v) : "null";
        if (f.find_first_of(".en") == std::string::npos) f += ".0";
        *out += f;
    }
    else if constexpr (std::is_pointer_v<T>) *out += v ? "true" : "false";
    else if constexpr (worklog_has_fields<T>::value) *out += worklog_fields(v);
    else *out += "null";
}
// returns the kernel's number in the log (-1: no log)
template <typename Tuple> inline long long worklog_kernel(const char* name, dim3 g, dim3 b, size_t smem, const void* stream, const Tuple& args) {
    if (!worklog_file()) return -1;
    std::lock_guard<std::mutex> lock(worklog().mu);
    std::string a;
    std::apply([&](const auto&... v) { (worklog_arg(&a, v), ...); }, args);
    worklog_line(worklog_fmt("\"t\":\"kernel\",\"name\":\"%s\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem\":%zu,\"stream\":%d,\"args\":[",
                             name, g.x, g.y, g.z, b.x, b.y, b.z, smem, worklog_stream(stream)) + a + "]", worklog().kernels);
    return worklog().kernels++;
}
inline void worklog_record(const void* event, const void* stream, bool wait) {
    if (!worklog_file()) return;
    std::lock_guard<std::mutex> lock(worklog().mu);
    worklog_line(worklog_fmt("\"t\":\"%s\",\"event\":%d,\"stream\":%d", wait ? "wait" : "record", worklog_event(event), worklog_stream(stream)));
}
// what: "stream" (on `obj`, a stream), "device", "event" (obj: the event)
inline void worklog_sync(const char* what, const void* obj) {
    if (!worklog_file()) return;
    std::lock_guard<std::mutex> lock(worklog().mu);
    bool ev = !strcmp(what, "event");
    worklog_line(worklog_fmt("\"t\":\"sync\",\"what\":\"%s\",\"%s\":%d", what, ev ? "event" : "stream", ev ? worklog_event(obj) : worklog_stream(obj)));
}
inline void worklog_copy(int kind, size_t n, const void* stream, bool blocking) {
    if (!worklog_file()) return;
    static const char* const kinds[] = {"h2h", "h2d", "d2h", "d2d", "default"};
    std::lock_guard<std::mutex> lock(worklog().mu);
    worklog_line(worklog_fmt("\"t\":\"copy\",\"kind\":\"%s\",\"bytes\":%zu,\"stream\":%d,\"blocking\":%s", kind < 0 ? "memset" : kind <= 4 ? kinds[kind] : "unknown",
                             n, worklog_stream(stream), blocking ? "true" : "false"));
}
inline void worklog_mark(const char* name) {
    if (!worklog_file()) return;
    std::lock_guard<std::mutex> lock(worklog().mu);
    worklog_line(worklog_fmt("\"t\":\"mark\",\"name\":\"%s\",\"n\":%d", name, ++worklog().marks));
}

// a named range of --profile (model/profile.h) begins or ends: on a stream (the point the stream's work reaches
// then, as an event's record) or on the host (stream -1). The step-time model places them on its predicted timeline.
inline void worklog_range(const char* name, bool begin, const void* stream, bool device) {
    if (!worklog_file()) return;
    std::string n;
    for (const char* c = name; *c; c++) { if (*c == '"' || *c == '\\') n += '\\'; n += (unsigned char)*c < 0x20 ? ' ' : *c; }
    std::lock_guard<std::mutex> lock(worklog().mu);
    worklog_line(worklog_fmt("\"t\":\"range\",\"name\":\"%s\",\"ph\":\"%s\",\"stream\":%d", n.c_str(), begin ? "B" : "E",
                             device ? worklog_stream(stream) : -1));
}

// what: the call that makes the host wait, for the work log ("stream" on obj, "device", "event" obj)
inline void count_sync(const char* what = "device", const void* obj = nullptr) {
    if (strcmp(what, "copy")) worklog_sync(what, obj);   // (a blocking copy's line is the copy's)
    count(&counters().syncs);
}
// a copy of `n` bytes of kind `kind` (cudaMemcpyKind: 1 host to device, 2 device to host; -1 a memset, not
// counted) on `stream`; `blocking`: cudaMemcpy
inline void count_copy(int kind, size_t n, bool blocking, const void* stream = nullptr) {
    worklog_copy(kind, n, stream, blocking);
    Counters& c = counters();
    if (kind == 1) { count(&c.h2d_bytes, (long long)n); count(&c.h2d_copies); }
    if (kind == 2) { count(&c.d2h_bytes, (long long)n); count(&c.d2h_copies); }
    if (blocking) count_sync("copy");
}
inline void count_launch() { count(&counters().launches); }
}  // namespace simt
