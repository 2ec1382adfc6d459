/*
 * comm_bench.cu — collective bandwidth over train_dbrx's communicator (parallel/comm.h), in the
 * manner of nccl-tests: all_reduce, all_gather, reduce_scatter and all_to_all of float32 from --min-bytes to
 * --max-bytes (doubling), time per operation, algbw and busbw with nccl-tests' formulas:
 *   size S = the bytes of the whole buffer (all_reduce: the buffer; all_gather: the gathered output;
 *            reduce_scatter: the input), n = ranks, t = time of one operation (the slowest rank's mean)
 *   algbw = S / t;  busbw = algbw * 2(n-1)/n (all_reduce), algbw * (n-1)/n (all_gather, reduce_scatter)
 * Every size is also checked for correct results (#wrong). As a cluster health check,
 * --expect-busbw X exits 1 when any size's busbw is below X GB/s.
 *   make dev/comm_bench && dev/mpirun.sh -np 4 dev/comm_bench --backend mpi -b 8 -e 1G
 * The MPI backend runs on host buffers; the NCCL backend (a build by nvcc) on the rank's GPU.
 * --selftest: instead of timing, checks every collective of the interface (all_gather, reduce_scatter,
 * all_reduce, broadcast, all_to_all, barrier; sub-groups) on sizes that do not divide evenly, and that
 * the byte counters equal the ring algorithms' volumes (parallel/README.md). Exit 0 when all pass.
 */
#include <string>
#include <vector>
#include "../model/common.h"
#include "../parallel/comm.h"
#include "../parallel/comm_check.h"

typedef struct {
    std::string op = "all", backend = "mpi";
    size_t min_bytes = 8, max_bytes = (size_t)1 << 30;
    int iters = 20, warmup = 5;
    double expect_busbw = 0;
    bool selftest = false;
} BenchArgs;

static size_t parse_size(const char* flag, const char* v) {
    char* end = NULL;
    double x = strtod(v, &end);
    double mult = 1;
    if (*end == 'K' || *end == 'k') { mult = 1024; end++; }
    else if (*end == 'M' || *end == 'm') { mult = 1024.0 * 1024; end++; }
    else if (*end == 'G' || *end == 'g') { mult = 1024.0 * 1024 * 1024; end++; }
    if (!*v || *end || !(x > 0)) fail(EXIT_BAD_INPUT, "%s expects a size like 8, 64K, 256M, 1G; got '%s'", flag, v);
    return (size_t)(x * mult);
}

static void parse(int argc, char** argv, BenchArgs* a) {
    for (int i = 1; i < argc; i++) {
        std::string f = argv[i];
        if (f == "--help" || f == "-h") {
            printf("usage: mpirun -np N dev/comm_bench [--op all|all_reduce|all_gather|reduce_scatter|all_to_all] [--backend mpi|nccl]\n"
                   "       [-b|--min-bytes 8] [-e|--max-bytes 1G] [-n|--iters 20] [-w|--warmup 5] [--expect-busbw GB/s]\n");
            exit(0);
        }
        if (f == "--selftest") { a->selftest = true; continue; }
        if (i + 1 >= argc) fail(EXIT_BAD_INPUT, "%s needs a value", argv[i]);
        const char* v = argv[++i];
        if (f == "--op") a->op = v;
        else if (f == "--backend") a->backend = v;
        else if (f == "-b" || f == "--min-bytes") a->min_bytes = parse_size(f.c_str(), v);
        else if (f == "-e" || f == "--max-bytes") a->max_bytes = parse_size(f.c_str(), v);
        else if (f == "-n" || f == "--iters") a->iters = atoi(v);
        else if (f == "-w" || f == "--warmup") a->warmup = atoi(v);
        else if (f == "--expect-busbw") a->expect_busbw = atof(v);
        else fail(EXIT_BAD_INPUT, "unknown flag '%s' (see --help)", f.c_str());
    }
    if (a->op != "all" && a->op != "all_reduce" && a->op != "all_gather" && a->op != "reduce_scatter" && a->op != "all_to_all")
        fail(EXIT_BAD_INPUT, "--op '%s' must be all, all_reduce, all_gather, reduce_scatter or all_to_all", a->op.c_str());
    if (a->backend != "mpi" && a->backend != "nccl") fail(EXIT_BAD_INPUT, "--backend '%s' must be mpi or nccl", a->backend.c_str());
    if (a->iters <= 0 || a->warmup < 0) fail(EXIT_BAD_INPUT, "--iters must be > 0 and --warmup >= 0");
    if (a->min_bytes > a->max_bytes) fail(EXIT_BAD_INPUT, "--min-bytes %zu is larger than --max-bytes %zu", a->min_bytes, a->max_bytes);
}

// value rank r puts at element i (small integers: sums are exact in float)
static inline float pattern(int r, size_t i) { return comm_check_pattern(r, i); }

// ---------------------------------------------------------------------------------------------
// --selftest (MPI backend, host buffers)

static int st_failures = 0;
static void st_check(CommGroup* g, bool ok, const char* what, long long n) {
    int bad = ok ? 0 : 1;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (g_comm_rank == 0) printf("%s %s (group %s of %d, n = %lld)%s\n", bad ? "FAIL" : "ok  ", what, g->name.c_str(),
                                 g->size, n, bad ? ": wrong on some rank" : "");
    st_failures += bad > 0;
}

// bytes the ring sends from rank r for a reduce-scatter or all-gather phase over n elements of es bytes
static uint64_t ring_phase_bytes(size_t n, int s, int r, size_t es, int reduce) {
    uint64_t b = 0;
    for (int k = 0; k < s - 1; k++) {
        size_t off, len;
        ring_chunk(n, s, ring_mod(reduce ? r - 1 - k : r - k, s), &off, &len);
        b += len * es;
    }
    return b;
}

static void selftest_group(CommGroup* g) {
    int s = g->size, r = g->rank;
    for (size_t count : {(size_t)1, (size_t)7, (size_t)1000, (size_t)100003}) {
        // all_gather of count per rank
        std::vector<float> send(count), recv(count * s);
        for (size_t i = 0; i < count; i++) send[i] = pattern(r, i);
        uint64_t b0 = comm_bytes_sent(g);
        comm_all_gather(g, send.data(), recv.data(), count, COMM_F32);
        bool ok = comm_bytes_sent(g) - b0 == (uint64_t)(s - 1) * count * 4;
        for (size_t i = 0; i < recv.size(); i++) ok = ok && recv[i] == pattern((int)(i / count), i % count);
        st_check(g, ok, "all_gather values and bytes", (long long)count);
        // reduce_scatter: send holds s * count
        std::vector<float> big(count * s), out(count);
        for (size_t i = 0; i < big.size(); i++) big[i] = pattern(r, i);
        b0 = comm_bytes_sent(g);
        comm_reduce_scatter(g, big.data(), out.data(), count, COMM_F32);
        ok = comm_bytes_sent(g) - b0 == (uint64_t)(s - 1) * count * 4;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int q = 0; q < s; q++) want += pattern(q, (size_t)r * count + i);
            ok = ok && out[i] == want;
        }
        for (size_t i = 0; i < big.size(); i++) ok = ok && big[i] == pattern(r, i);   // input intact
        st_check(g, ok, "reduce_scatter values, bytes, input intact", (long long)count);
        // all_reduce of count (any count: chunks need not be equal) in double
        std::vector<double> x(count);
        for (size_t i = 0; i < count; i++) x[i] = pattern(r, i);
        b0 = comm_bytes_sent(g);
        comm_all_reduce(g, x.data(), count, COMM_F64);
        ok = comm_bytes_sent(g) - b0 == ring_phase_bytes(count, s, r, 8, 1) + ring_phase_bytes(count, s, r, 8, 0);
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int q = 0; q < s; q++) want += pattern(q, i);
            ok = ok && x[i] == want;
        }
        st_check(g, ok, "all_reduce values and bytes", (long long)count);
        // broadcast from the last rank
        std::vector<int> bc(count);
        for (size_t i = 0; i < count; i++) bc[i] = r == s - 1 ? (int)(i * 7 + 1) : -1;
        b0 = comm_bytes_sent(g);
        comm_broadcast(g, bc.data(), count * 4, s - 1);
        ok = comm_bytes_sent(g) - b0 == (s > 1 && r != s - 2 ? count * 4 : 0);   // every rank of the chain but its end
        for (size_t i = 0; i < count; i++) ok = ok && bc[i] == (int)(i * 7 + 1);
        st_check(g, ok, "broadcast values and bytes", (long long)count);
        // all_to_all: chunk j of rank r goes to rank j
        std::vector<int> a2a(count * s), back(count * s);
        for (int j = 0; j < s; j++) for (size_t i = 0; i < count; i++) a2a[j * count + i] = (int)(r * 1000003 + j * 7919 + i);
        b0 = comm_bytes_sent(g);
        comm_all_to_all(g, a2a.data(), back.data(), count, COMM_I32);
        ok = comm_bytes_sent(g) - b0 == (uint64_t)(s - 1) * count * 4;
        for (int j = 0; j < s; j++) for (size_t i = 0; i < count; i++) ok = ok && back[j * count + i] == (int)(j * 1000003 + r * 7919 + i);
        st_check(g, ok, "all_to_all values and bytes", (long long)count);
    }
    comm_barrier(g);
    st_check(g, true, "barrier", 0);
}

static int selftest(Comm* comm) {
    CommGroup* w = &comm->world_group;
    selftest_group(w);
    // sub-groups as HSDP makes them: shard groups of 2 consecutive ranks and replica groups across them
    if (comm->world % 2 == 0 && comm->world > 2) {
        CommGroup shard = comm_split(w, comm->rank / 2, comm->rank, "shard", 0);
        CommGroup replica = comm_split(w, comm->rank % 2, comm->rank, "replica", 0);
        bool ok = shard.size == 2 && shard.members[shard.rank] == comm->rank && shard.members[0] == comm->rank / 2 * 2 &&
                  replica.size == comm->world / 2 && replica.members[replica.rank] == comm->rank;
        st_check(w, ok, "comm_split: shard groups of 2 consecutive ranks, replica groups", comm->world);
        selftest_group(&shard);
        selftest_group(&replica);
        comm_group_free(&shard);
        comm_group_free(&replica);
    }
    if (comm->rank == 0) printf("%s\n", st_failures ? "selftest: FAILED" : "selftest: all passed");
    return st_failures ? 1 : 0;
}

int main(int argc, char** argv) {
    BenchArgs a;
    parse(argc, argv, &a);
    Comm comm = comm_init(&argc, &argv);
    if (a.selftest) {
        int rc = selftest(&comm);
        comm_finalize();
        return rc;
    }
    CommGroup g = comm.world_group;
    int device = 0;
    if (a.backend == "nccl") { g = comm_world_nccl(&comm); device = 1; }
    int n = g.size, r = g.rank;
    std::vector<std::string> ops;
    if (a.op == "all") ops = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};
    else ops = {a.op};
    if (r == 0) {
        printf("# comm_bench: %d rank(s), backend %s, float32, %d warmup + %d timed iterations per size\n", n,
               a.backend.c_str(), a.warmup, a.iters);
        printf("# size = bytes of the whole buffer; time = slowest rank's mean; busbw factor 2(n-1)/n all_reduce, (n-1)/n others\n");
    }
    int short_sizes = 0, wrong_total = 0;
    for (const std::string& op : ops) {
        if (r == 0) printf("#\n# %-14s %14s %12s %12s %12s %12s %8s\n", op.c_str(), "size(B)", "count(elem)", "time(us)",
                           "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 2) {
            // timed and checked in parallel/comm_check.h (shared with the health check of train_dbrx)
            CollectiveResult c = comm_check_collective(&g, &comm.world_group, op, bytes, a.warmup, a.iters, device);
            if (c.total == 0) continue;
            bool is_short = a.expect_busbw > 0 && c.busbw < a.expect_busbw;
            if (r == 0)
                printf("  %-14s %14.0f %12zu %12.2f %12.3f %12.3f %8lld%s\n", "", (double)c.bytes, c.total, c.seconds * 1e6, c.algbw,
                       c.busbw, c.wrong, is_short ? "  < expected" : "");
            short_sizes += is_short;
            wrong_total += c.wrong > 0;
            if (bytes > a.max_bytes / 2) break;   // no overflow past the top
        }
    }
    if (r == 0) {
        if (wrong_total) printf("# FAILED: %d size(s) gave wrong results\n", wrong_total);
        if (a.expect_busbw > 0)
            printf("# health check: %d size(s) below the expected busbw of %.3f GB/s\n", short_sizes, a.expect_busbw);
        fflush(stdout);
    }
    if (device) comm_group_free(&g);
    comm_finalize();
    return wrong_total ? 1 : short_sizes ? 1 : 0;
}
