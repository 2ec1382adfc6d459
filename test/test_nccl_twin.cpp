/*
 * test_nccl_twin.cpp — the NCCL twin (test/simt/nccl_twin.h) and the communicator's NCCL path
 * (parallel/comm.h with use_nccl = 1) under the SIMT emulator and mpirun: every rank runs every case on
 * deterministic per-rank inputs and checks its results against a scalar reference that it computes
 * itself, in the twin's documented summation order (BF16/FP16 rounded at every hop with cuda_bf16.h /
 * cuda_fp16.h, not the twin's own conversions):
 *   all-gather, reduce-scatter (in place and not), all-reduce (f32, f64, bf16, i32; sum, max, ...),
 *   broadcast from every root, all-to-all and grouped send/recv, counts 0, 1 and uneven ones, HSDP
 *   sub-groups, identical bits on every rank, the bytes measured against the ring formulas, the unique
 *   id check, argument errors, the watchdog and ncclCommAbort, non-blocking communicators (ncclInProgress,
 *   ncclCommGetAsyncError, ncclCommFinalize) and an abort from another thread that ends a blocked wait.
 * Run with dev/mpirun.sh -np 1..4. Every rank's report is gathered to rank 0, which prints them.
 * NCCL_TWIN_DEBUG_PLANT=reduce_order (the twin's planted bug) must make "summation order" fail at -np 4.
 * NCCL_TWIN_TEST_HANG=1 (-np 2): rank 1 stops itself before an all-reduce; rank 0 must exit 1 after
 * comm_set_timeout(3) naming rank 1 (NCCL_TWIN_TEST_PIDFILE: each rank writes its pid to FILE.<rank>).
 */
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest.h>
#include <signal.h>
#include <thread>
#include <sstream>
#include "../parallel/comm.h"   // first: the emulator's simt.h must precede the CUDA headers
#include <cuda_fp16.h>

static Comm* g_comm = NULL;

// ---------------------------------------------------------------------------------------------
// deterministic inputs and the reference

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t bits_of(int world_rank, size_t i, uint64_t salt) {
    return mix64(mix64(salt) ^ mix64((uint64_t)world_rank * 0x100000001ull + 977) ^ (uint64_t)i * 0x2545F4914F6CDD1Dull);
}
// a float with a wide spread of exponents (so that the order of a sum shows in its bits); `small`:
// in [0.5, 2), for products
static inline double gen_real(int world_rank, size_t i, uint64_t salt, int emax, bool small) {
    uint64_t h = bits_of(world_rank, i, salt);
    double m = 1.0 + (double)((h >> 11) & 0xFFFFFFFFFull) / 68719476736.0;   // [1, 2)
    if (small) return (h & 1) ? m : m * 0.5;
    int e = (int)((h >> 2) % (uint64_t)(2 * emax + 1)) - emax;
    return ((h >> 1) & 1 ? -1.0 : 1.0) * std::ldexp(m, e);
}

// the reference's arithmetic per type: storage T, computed in C, rounded with the CUDA headers
template <typename T> struct Ref {
    typedef T C;
    static C load(T v) { return v; }
    static T store(C v) { return v; }
    static T gen(int wr, size_t i, uint64_t salt, bool small) {
        if constexpr (std::is_integral<T>::value) return small ? (T)(bits_of(wr, i, salt) % 7) : (T)bits_of(wr, i, salt);
        else return (T)gen_real(wr, i, salt, std::is_same<T, double>::value ? 40 : 20, small);
    }
};
template <> struct Ref<__nv_bfloat16> {
    typedef float C;
    static C load(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __nv_bfloat16 store(C v) { return __float2bfloat16(v); }
    static __nv_bfloat16 gen(int wr, size_t i, uint64_t salt, bool small) { return store((float)gen_real(wr, i, salt, 12, small)); }
};
template <> struct Ref<__half> {
    typedef float C;
    static C load(__half v) { return __half2float(v); }
    static __half store(C v) { return __float2half(v); }
    static __half gen(int wr, size_t i, uint64_t salt, bool small) { return store((float)gen_real(wr, i, salt, 6, small)); }
};
template <typename T> static ncclDataType_t nccl_of();
template <> ncclDataType_t nccl_of<int8_t>() { return ncclInt8; }
template <> ncclDataType_t nccl_of<uint8_t>() { return ncclUint8; }
template <> ncclDataType_t nccl_of<int32_t>() { return ncclInt32; }
template <> ncclDataType_t nccl_of<uint32_t>() { return ncclUint32; }
template <> ncclDataType_t nccl_of<int64_t>() { return ncclInt64; }
template <> ncclDataType_t nccl_of<uint64_t>() { return ncclUint64; }
template <> ncclDataType_t nccl_of<__half>() { return ncclFloat16; }
template <> ncclDataType_t nccl_of<__nv_bfloat16>() { return ncclBfloat16; }
template <> ncclDataType_t nccl_of<float>() { return ncclFloat32; }
template <> ncclDataType_t nccl_of<double>() { return ncclFloat64; }

template <typename C> static C ref_apply(C a, C b, ncclRedOp_t op) {
    if constexpr (std::is_integral<C>::value) {
        typedef typename std::make_unsigned<C>::type U;
        if (op == ncclProd) return (C)(U)((U)a * (U)b);
        if (op == ncclMax) return std::max(a, b);
        if (op == ncclMin) return std::min(a, b);
        return (C)(U)((U)a + (U)b);
    } else {
        if (op == ncclProd) return a * b;
        if (op == ncclMax) return std::fmax(a, b);
        if (op == ncclMin) return std::fmin(a, b);
        return a + b;
    }
}

// The reduction over S ranks of one element whose chunk belongs to group rank `owner`, in the twin's
// documented order ((x_{owner+1} + x_{owner+2}) + ...) + x_owner, rounded to T at every hop. x(r): group
// rank r's input. ncclAvg as NCCL: floats pre-multiplied by (T)(1.0 / S), integers divided at the end.
template <typename T, typename F> static T ref_reduce(int S, int owner, ncclRedOp_t op, F x) {
    typedef Ref<T> R;
    typedef typename R::C C;
    bool premul = op == ncclAvg && !std::is_integral<C>::value;
    C s = std::is_same<T, double>::value ? (C)(1.0 / S) : R::load(R::store((C)(float)(1.0 / S)));
    auto pre = [&](T v) { return premul ? R::store(R::load(v) * s) : v; };
    T acc = pre(x((owner + 1) % S));
    for (int k = 2; k <= S; k++) acc = R::store(ref_apply<C>(R::load(acc), R::load(pre(x((owner + k) % S))), op));
    if constexpr (std::is_integral<C>::value) if (op == ncclAvg) acc = (T)(acc / (T)S);
    return acc;
}

// chunk i of an all-reduce over n elements (the twin's layout, computed here independently)
static size_t ref_chunk_elems(size_t n, int S) { return (n + S - 1) / S; }
static size_t ref_chunk_len(size_t n, int S, int i) {
    size_t c = ref_chunk_elems(n, S), lo = std::min((size_t)i * c, n);
    return std::min(lo + c, n) - lo;
}

static uint64_t fnv(const void* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
    return h;
}
// the same bytes on every rank of the group
static bool same_on_all(CommGroup* g, const void* p, size_t bytes) {
    uint64_t h = fnv(p, bytes);
    std::vector<uint64_t> all(g->size);
    MPI_CHECK(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, g->mpi));
    for (uint64_t a : all) if (a != h) return false;
    return true;
}
static uint64_t sum_over(CommGroup* g, uint64_t v) {
    uint64_t s = 0;
    MPI_CHECK(MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, g->mpi));
    return s;
}
template <typename T> static bool same_bits(const T& a, const T& b) { return memcmp(&a, &b, sizeof(T)) == 0; }
// index of the first element whose bits differ, or -1
template <typename T> static long first_diff(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); i++) if (!same_bits(a[i], b[i])) return (long)i;
    return -1;
}

static CommType comm_type_of(ncclDataType_t t) {
    switch (t) { case ncclFloat32: return COMM_F32; case ncclFloat64: return COMM_F64; case ncclBfloat16: return COMM_BF16;
                 case ncclInt32: return COMM_I32; default: return COMM_BYTE; }
}

// the world on NCCL, and sub-groups: for every S that divides the world, shard groups of S consecutive
// ranks and replica groups (HSDP's layout, parallel/zero.h)
struct Groups { std::vector<CommGroup> g; };
static Groups make_groups() {
    Groups out;
    out.g.push_back(comm_world_nccl(g_comm));
    int W = g_comm->world, r = g_comm->rank;
    for (int S = 1; S < W; S++) {
        if (W % S) continue;
        out.g.push_back(comm_split(&g_comm->world_group, r / S, r, "shard", 1));
        out.g.push_back(comm_split(&g_comm->world_group, r % S, r, "replica", 1));
    }
    return out;
}
static void free_groups(Groups* gs) { for (CommGroup& g : gs->g) comm_group_free(&g); }

static const size_t COUNTS[] = {0, 1, 7, 1003, 4096};

// ---------------------------------------------------------------------------------------------

TEST_CASE("bf16 and fp16 conversions of the twin match cuda_bf16.h and cuda_fp16.h") {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = nccl_twin_bf16_to_f32((uint16_t)h), b = __bfloat162float(__ushort_as_bfloat16((unsigned short)h));
        float c = nccl_twin_f16_to_f32((uint16_t)h), d = __half2float(__ushort_as_half((unsigned short)h));
        if (!(same_bits(a, b) || (std::isnan(a) && std::isnan(b)))) bad++;
        if (!(same_bits(c, d) || (std::isnan(c) && std::isnan(d)))) bad++;
    }
    CHECK(bad == 0);
    // every 4099th float bit pattern, and the edges: ties, subnormals, overflow, signed zeros
    std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 6.1035156e-05f, 6.0e-08f, 2.98e-08f, 2.9802322e-08f,
                             1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 1.0f + 1.0f / 2048, 3.4e38f, INFINITY, -INFINITY};
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) { float f; uint32_t v = (uint32_t)u; memcpy(&f, &v, 4); xs.push_back(f); }
    long bad16 = 0, badbf = 0;
    for (float f : xs) {
        if (std::isnan(f)) {
            if (!std::isnan(nccl_twin_bf16_to_f32(nccl_twin_f32_to_bf16(f)))) badbf++;
            if (!std::isnan(nccl_twin_f16_to_f32(nccl_twin_f32_to_f16(f)))) bad16++;
            continue;
        }
        if (nccl_twin_f32_to_bf16(f) != __bfloat16_as_ushort(__float2bfloat16(f))) badbf++;
        if (nccl_twin_f32_to_f16(f) != __half_as_ushort(__float2half(f))) bad16++;
    }
    CHECK(badbf == 0);
    CHECK(bad16 == 0);
}

// comm.h's all-gather over the twin, every group; bytes: (S-1) * count * es, measured == formula
TEST_CASE("comm_all_gather on NCCL: every type, uneven counts, every group; bytes == (S-1)*count*es") {
    Groups gs = make_groups();
    for (CommGroup& g : gs.g) {
        REQUIRE(g.nccl == 1);
        for (size_t n : COUNTS) {
            for (CommType t : {COMM_F32, COMM_BF16, COMM_BYTE, COMM_F64}) {
                size_t es = comm_type_size(t), bytes = n * es;
                auto input = [&](int wr) {
                    std::vector<unsigned char> v(bytes);
                    for (size_t i = 0; i < bytes; i++) v[i] = (unsigned char)bits_of(wr, i, 11 + (uint64_t)t);
                    return v;
                };
                std::vector<unsigned char> mine = input(g.members[g.rank]), got(bytes * g.size + 1, 0xEE), want;
                for (int r = 0; r < g.size; r++) {
                    std::vector<unsigned char> v = input(g.members[r]);
                    want.insert(want.end(), v.begin(), v.end());
                }
                want.push_back(0xEE);   // nothing written past the end
                uint64_t b0 = comm_bytes_sent(&g), f0 = g.nccl_formula_bytes;
                comm_all_gather(&g, mine.data(), got.data(), n, t);
                comm_sync(&g);
                INFO("group ", g.name, " (", g.size, " ranks), count ", n, ", ", comm_type_name(t));
                CHECK(got == want);
                CHECK(comm_bytes_sent(&g) - b0 == (uint64_t)(g.size - 1) * bytes);
                CHECK(g.nccl_formula_bytes - f0 == comm_bytes_sent(&g) - b0);
                // in place: this rank's chunk already in the output
                std::vector<unsigned char> buf(bytes * g.size, 0xEE);
                memcpy(buf.data() + (size_t)g.rank * bytes, mine.data(), bytes);
                comm_all_gather(&g, buf.data() + (size_t)g.rank * bytes, buf.data(), n, t);
                comm_sync(&g);   // stream-ordered: the result is there once the stream is waited for
                want.pop_back();
                CHECK(buf == want);
            }
        }
    }
    free_groups(&gs);
}

template <typename T> static void check_reduce_scatter(CommGroup* g, size_t n, uint64_t salt) {
    typedef Ref<T> R;
    ncclDataType_t nt = nccl_of<T>();
    CommType ct = comm_type_of(nt);
    int S = g->size, r = g->rank;
    auto x = [&](int gr, size_t i) { return R::gen(g->members[gr], i, salt, false); };
    std::vector<T> in((size_t)S * n), want(n);
    for (size_t i = 0; i < in.size(); i++) in[i] = x(r, i);
    for (size_t i = 0; i < n; i++) want[i] = ref_reduce<T>(S, r, ncclSum, [&](int gr) { return x(gr, (size_t)r * n + i); });
    std::vector<T> orig = in, out(n + 1);
    uint64_t b0 = comm_bytes_sent(g), f0 = g->nccl_formula_bytes;
    comm_reduce_scatter(g, in.data(), out.data(), n, ct);
    comm_sync(g);
    INFO("group ", g->name, " (", S, " ranks), count ", n, ", ", comm_type_name(ct));
    out.pop_back();
    CHECK(first_diff(out, want) == -1);
    CHECK(first_diff(in, orig) == -1);   // the input is left intact
    CHECK(comm_bytes_sent(g) - b0 == (uint64_t)(S - 1) * n * sizeof(T));
    CHECK(g->nccl_formula_bytes - f0 == comm_bytes_sent(g) - b0);
    // in place: chunk `rank` of the buffer gets the result
    comm_reduce_scatter_inplace(g, in.data(), n, ct);
    comm_sync(g);
    std::vector<T> own(in.begin() + (size_t)r * n, in.begin() + (size_t)(r + 1) * n);
    CHECK(first_diff(own, want) == -1);
}

TEST_CASE("comm_reduce_scatter and comm_reduce_scatter_inplace on NCCL: f32, f64, bf16, i32 in the documented order") {
    Groups gs = make_groups();
    for (CommGroup& g : gs.g)
        for (size_t n : COUNTS) {
            check_reduce_scatter<float>(&g, n, 21);
            check_reduce_scatter<double>(&g, n, 22);
            check_reduce_scatter<__nv_bfloat16>(&g, n, 23);
            check_reduce_scatter<int32_t>(&g, n, 24);
        }
    free_groups(&gs);
}

template <typename T> static void check_all_reduce(CommGroup* g, size_t n, uint64_t salt) {
    typedef Ref<T> R;
    ncclDataType_t nt = nccl_of<T>();
    CommType ct = comm_type_of(nt);
    int S = g->size, r = g->rank;
    auto x = [&](int gr, size_t i) { return R::gen(g->members[gr], i, salt, false); };
    std::vector<T> buf(n), want(n);
    for (size_t i = 0; i < n; i++) buf[i] = x(r, i);
    size_t c = ref_chunk_elems(n, S);
    for (size_t i = 0; i < n; i++) want[i] = ref_reduce<T>(S, (int)(i / c), ncclSum, [&](int gr) { return x(gr, i); });
    uint64_t b0 = comm_bytes_sent(g), f0 = g->nccl_formula_bytes;
    comm_all_reduce(g, buf.data(), n, ct);
    comm_sync(g);
    uint64_t sent = comm_bytes_sent(g) - b0, formula = g->nccl_formula_bytes - f0;
    INFO("group ", g->name, " (", S, " ranks), count ", n, ", ", comm_type_name(ct));
    long d = first_diff(buf, want);
    CHECK(d == -1);
    CHECK(same_on_all(g, buf.data(), n * sizeof(T)));   // every rank the same bits
    // bytes: what this rank's ring sends, from the chunk lengths; the formula when S divides n; the
    // sum over ranks exactly 2 (S-1) n es
    uint64_t es = sizeof(T), per_rank = (2 * n - ref_chunk_len(n, S, r) - ref_chunk_len(n, S, (r + 1) % S)) * es;
    CHECK(sent == per_rank);
    if (n % S == 0) CHECK(sent == formula);
    CHECK(sum_over(g, sent) == 2 * (uint64_t)(S - 1) * n * es);
    CHECK((formula > sent ? formula - sent : sent - formula) < 2 * c * es + 1);
}

TEST_CASE("comm_all_reduce on NCCL: f32, f64, bf16 (rounded every hop), i32; identical bits on every rank; bytes") {
    Groups gs = make_groups();
    for (CommGroup& g : gs.g)
        for (size_t n : COUNTS) {
            check_all_reduce<float>(&g, n, 31);
            check_all_reduce<double>(&g, n, 32);
            check_all_reduce<__nv_bfloat16>(&g, n, 33);
            check_all_reduce<int32_t>(&g, n, 34);
        }
    free_groups(&gs);
}

// The negative control's target: the all-reduce's bits are those of the documented ring order, and the
// inputs are such that another order (rank 0 first, in rank order) gives other bits for S >= 3 — so a
// changed order cannot pass. NCCL_TWIN_DEBUG_PLANT=reduce_order makes this case fail at S >= 4.
TEST_CASE("summation order: all-reduce and reduce-scatter are bit for bit the documented ring order") {
    CommGroup g = comm_world_nccl(g_comm);
    int S = g.size;
    const size_t n = 4096;
    auto x = [&](int gr, size_t i) { return Ref<float>::gen(g.members[gr], i, 41, false); };
    std::vector<float> buf(n), ring(n), seq(n);
    for (size_t i = 0; i < n; i++) {
        buf[i] = x(g.rank, i);
        ring[i] = ref_reduce<float>(S, (int)(i / ref_chunk_elems(n, S)), ncclSum, [&](int gr) { return x(gr, i); });
        float s = x(0, i);
        for (int r = 1; r < S; r++) s += x(r, i);
        seq[i] = s;
    }
    comm_all_reduce(&g, buf.data(), n, COMM_F32);
    comm_sync(&g);
    long d = first_diff(buf, ring);
    INFO("first element off the ring order: ", d);
    CHECK(d == -1);
    if (S >= 3) CHECK(first_diff(ring, seq) != -1);   // the inputs tell the orders apart
    // reduce-scatter: chunk `rank`, order ((x_{r+1} + x_{r+2}) + ...) + x_r
    std::vector<float> in((size_t)S * n), out(n), want(n);
    for (size_t i = 0; i < in.size(); i++) in[i] = x(g.rank, i);
    for (size_t i = 0; i < n; i++) want[i] = ref_reduce<float>(S, g.rank, ncclSum, [&](int gr) { return x(gr, (size_t)g.rank * n + i); });
    comm_reduce_scatter(&g, in.data(), out.data(), n, COMM_F32);
    comm_sync(&g);
    CHECK(first_diff(out, want) == -1);
    comm_group_free(&g);
}

TEST_CASE("comm_broadcast on NCCL from every root: 0, 1, 13 bytes and 3 MiB + 5 (pieces); bytes: all but the chain's last") {
    Groups gs = make_groups();
    for (CommGroup& g : gs.g)
        for (size_t bytes : {(size_t)0, (size_t)1, (size_t)13, ((size_t)3 << 20) + 5}) {
            if (bytes > 100 && g.size == 1 && &g != &gs.g[0]) continue;
            for (int root = 0; root < g.size; root++) {
                std::vector<unsigned char> buf(bytes), want(bytes);
                for (size_t i = 0; i < bytes; i++) {
                    want[i] = (unsigned char)bits_of(g.members[root], i, 51);
                    buf[i] = g.rank == root ? want[i] : (unsigned char)0xEE;
                }
                uint64_t b0 = comm_bytes_sent(&g), f0 = g.nccl_formula_bytes;
                comm_broadcast(&g, buf.data(), bytes, root);
                comm_sync(&g);
                INFO("group ", g.name, " (", g.size, " ranks), ", bytes, " bytes from root ", root);
                CHECK(buf == want);
                bool last = (g.rank + 1) % g.size == root;
                CHECK(comm_bytes_sent(&g) - b0 == (last ? 0 : bytes));
                CHECK(g.nccl_formula_bytes - f0 == comm_bytes_sent(&g) - b0);
            }
        }
    free_groups(&gs);
}

TEST_CASE("comm_all_to_all on NCCL (grouped ncclSend/ncclRecv, including to itself); bytes == (S-1)*count*es") {
    Groups gs = make_groups();
    for (CommGroup& g : gs.g)
        for (size_t n : {(size_t)0, (size_t)1, (size_t)5, (size_t)1000}) {
            int S = g.size, r = g.rank;
            // element i of the chunk from rank a to rank b
            auto v = [&](int a, int b, size_t i) { return (float)(bits_of(g.members[a], (size_t)b * 100000 + i, 61) % 100000); };
            std::vector<float> send((size_t)S * n), recv((size_t)S * n, -1.0f), want((size_t)S * n);
            for (int p = 0; p < S; p++)
                for (size_t i = 0; i < n; i++) { send[(size_t)p * n + i] = v(r, p, i); want[(size_t)p * n + i] = v(p, r, i); }
            uint64_t b0 = comm_bytes_sent(&g);
            comm_all_to_all(&g, send.data(), recv.data(), n, COMM_F32);
            comm_sync(&g);
            INFO("group ", g.name, " (", S, " ranks), count ", n);
            CHECK(first_diff(recv, want) == -1);
            CHECK(comm_bytes_sent(&g) - b0 == (uint64_t)(S - 1) * n * 4);
        }
    free_groups(&gs);
}

// HSDP: shard groups of S consecutive ranks, replica groups across them (the ZeRO layout): gather in the
// shard group, reduce-scatter in it, all-reduce across replicas, against the reference on world ranks
TEST_CASE("HSDP sub-groups on NCCL: shard gather/reduce-scatter, replica all-reduce, names and members") {
    int W = g_comm->world, rank = g_comm->rank;
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        CommGroup shard = comm_split(&g_comm->world_group, rank / S, rank, "shard", 1);
        CommGroup replica = comm_split(&g_comm->world_group, rank % S, rank, "replica", 1);
        INFO("S = ", S, " of ", W);
        CHECK(shard.size == S);
        CHECK(replica.size == W / S);
        for (int i = 0; i < shard.size; i++) CHECK(shard.members[i] == rank / S * S + i);
        for (int i = 0; i < replica.size; i++) CHECK(replica.members[i] == rank % S + i * S);
        CHECK(std::string(nccl_twin_get_name(shard.nc)) == "shard");
        CHECK(std::string(nccl_twin_get_name(replica.nc)) == "replica");
        int cnt = 0, me = -1;
        CHECK(ncclCommCount(shard.nc, &cnt) == ncclSuccess);
        CHECK(ncclCommUserRank(shard.nc, &me) == ncclSuccess);
        CHECK(cnt == S);
        CHECK(me == rank % S);
        check_reduce_scatter<float>(&shard, 333, 71);
        check_all_reduce<float>(&replica, 1001, 72);
        check_all_reduce<__nv_bfloat16>(&replica, 77, 73);
        // a gathered bf16 "unit": every shard's piece in shard-rank order
        std::vector<uint16_t> piece(37), all((size_t)37 * S);
        for (size_t i = 0; i < piece.size(); i++) piece[i] = (uint16_t)bits_of(rank, i, 74);
        comm_all_gather(&shard, piece.data(), all.data(), piece.size(), COMM_BF16);
        comm_sync(&shard);
        long bad = 0;
        for (int s = 0; s < S; s++)
            for (size_t i = 0; i < piece.size(); i++) bad += all[(size_t)s * 37 + i] != (uint16_t)bits_of(shard.members[s], i, 74);
        CHECK(bad == 0);
        comm_barrier(&shard);
        comm_barrier(&replica);
        comm_group_free(&shard);
        comm_group_free(&replica);
    }
}

// ---------------------------------------------------------------------------------------------
// the twin's API directly

// A call on a non-blocking communicator (comm_split makes them so): ncclInProgress is polled with
// ncclCommGetAsyncError to the final state, as NCCL requires (a bound on the polls: the twin answers
// ncclInProgress to one poll only, so more means a bug)
static ncclResult_t settle(ncclComm_t nc, ncclResult_t r) {
    for (int polls = 0; r == ncclInProgress && polls < 100; polls++) {
        ncclResult_t state = ncclInternalError;
        if (ncclCommGetAsyncError(nc, &state) != ncclSuccess) return ncclInternalError;
        r = state;
    }
    return r;
}

template <typename T> static void check_nccl_all_reduce(ncclComm_t nc, CommGroup* g, ncclRedOp_t op, size_t n, uint64_t salt) {
    typedef Ref<T> R;
    int S = g->size, r = g->rank;
    bool small = op == ncclProd;
    auto x = [&](int gr, size_t i) { return R::gen(g->members[gr], i, salt, small); };
    std::vector<T> send(n), recv(n), want(n);
    for (size_t i = 0; i < n; i++) send[i] = x(r, i);
    size_t c = ref_chunk_elems(n, S);
    for (size_t i = 0; i < n; i++) want[i] = ref_reduce<T>(S, (int)(i / c), op, [&](int gr) { return x(gr, i); });
    std::vector<T> orig = send;
    CHECK(settle(nc, ncclAllReduce(send.data(), recv.data(), n, nccl_of<T>(), op, nc, NULL)) == ncclSuccess);
    INFO("ncclAllReduce type ", (int)nccl_of<T>(), " op ", (int)op, " count ", n, " ranks ", S);
    CHECK(first_diff(recv, want) == -1);
    CHECK(first_diff(send, orig) == -1);
    CHECK(same_on_all(g, recv.data(), n * sizeof(T)));
    // in place gives the same bits
    CHECK(settle(nc, ncclAllReduce(send.data(), send.data(), n, nccl_of<T>(), op, nc, NULL)) == ncclSuccess);
    CHECK(first_diff(send, want) == -1);
}
template <typename T> static void check_all_ops(ncclComm_t nc, CommGroup* g, uint64_t salt) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg})
        for (size_t n : {(size_t)0, (size_t)1, (size_t)10, (size_t)257}) check_nccl_all_reduce<T>(nc, g, op, n, salt + (uint64_t)op);
}

TEST_CASE("stream order: a collective on the group's stream runs when the stream is waited for; bytes count once it ran") {
    CommGroup g = comm_world_nccl(g_comm);
    const int S = g.size, n = 960;   // divisible by 1..4 ranks: the ring's chunks are even
    std::vector<float> buf(n, 1.0f + g.rank);
    uint64_t b0 = comm_bytes_sent(&g);
    comm_all_reduce(&g, buf.data(), n, COMM_F32);                 // queued on g.stream
    CHECK(buf[n - 1] == 1.0f + g.rank);                             // not run yet: the stream was not waited for
    CHECK(comm_bytes_sent(&g) == b0);
    cudaEvent_t e = nullptr;
    REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    REQUIRE(cudaEventRecord(e, g.stream) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(0, e, 0) == cudaSuccess);          // the compute stream waits: it runs now
    CHECK(buf[n - 1] == S * (S + 1) / 2.0f);
    CHECK(comm_bytes_sent(&g) - b0 == 2 * (uint64_t)(S - 1) * n * 4 / S);
    // two collectives queued in order, then comm_sync: both, in issue order
    comm_all_reduce(&g, buf.data(), n, COMM_F32);
    comm_broadcast(&g, buf.data(), sizeof(float), 0);
    comm_sync(&g);
    CHECK(buf[0] == (float)S * S * (S + 1) / 2.0f);
    REQUIRE(cudaEventDestroy(e) == cudaSuccess);
    comm_group_free(&g);
}

TEST_CASE("ncclAllReduce: sum, prod, max, min, avg on every data type, in place and not") {
    CommGroup g = comm_world_nccl(g_comm);
    check_all_ops<int8_t>(g.nc, &g, 100);
    check_all_ops<uint8_t>(g.nc, &g, 110);
    check_all_ops<int32_t>(g.nc, &g, 120);
    check_all_ops<uint32_t>(g.nc, &g, 130);
    check_all_ops<int64_t>(g.nc, &g, 140);
    check_all_ops<uint64_t>(g.nc, &g, 150);
    check_all_ops<__half>(g.nc, &g, 160);
    check_all_ops<__nv_bfloat16>(g.nc, &g, 170);
    check_all_ops<float>(g.nc, &g, 180);
    check_all_ops<double>(g.nc, &g, 190);
    comm_group_free(&g);
}

TEST_CASE("ncclAllGather, ncclReduceScatter (max), ncclBroadcast out of place; ncclBcast") {
    CommGroup g = comm_world_nccl(g_comm);
    int S = g.size, r = g.rank;
    for (size_t n : {(size_t)0, (size_t)1, (size_t)99}) {
        INFO("count ", n);
        std::vector<double> mine(n), all((size_t)S * n, -1.0), want;
        for (size_t i = 0; i < n; i++) mine[i] = Ref<double>::gen(r, i, 201, false);
        for (int p = 0; p < S; p++) for (size_t i = 0; i < n; i++) want.push_back(Ref<double>::gen(p, i, 201, false));
        CHECK(settle(g.nc, ncclAllGather(mine.data(), all.data(), n, ncclFloat64, g.nc, NULL)) == ncclSuccess);
        CHECK(first_diff(all, want) == -1);
        // reduce-scatter with max: order-free, so any ring must give the maximum
        std::vector<float> in((size_t)S * n), out(n), mx(n);
        for (size_t i = 0; i < in.size(); i++) in[i] = Ref<float>::gen(r, i, 202, false);
        for (size_t i = 0; i < n; i++) {
            mx[i] = -INFINITY;
            for (int p = 0; p < S; p++) mx[i] = std::fmax(mx[i], Ref<float>::gen(p, (size_t)r * n + i, 202, false));
        }
        CHECK(settle(g.nc, ncclReduceScatter(in.data(), out.data(), n, ncclFloat32, ncclMax, g.nc, NULL)) == ncclSuccess);
        CHECK(first_diff(out, mx) == -1);
        for (int root = 0; root < S; root++) {
            std::vector<int64_t> src(n), dst(n, -7), exp(n);
            for (size_t i = 0; i < n; i++) { exp[i] = (int64_t)bits_of(root, i, 203); src[i] = r == root ? exp[i] : 0; }
            CHECK(settle(g.nc, ncclBroadcast(src.data(), dst.data(), n, ncclInt64, root, g.nc, NULL)) == ncclSuccess);
            CHECK(first_diff(dst, exp) == -1);
            if (r != root) CHECK(std::all_of(src.begin(), src.end(), [](int64_t v) { return v == 0; }));
            CHECK(settle(g.nc, ncclBcast(src.data(), n, ncclInt64, root, g.nc, NULL)) == ncclSuccess);
            CHECK(first_diff(src, exp) == -1);
        }
    }
    comm_group_free(&g);
}

// all-to-all with a different count for every pair, from grouped sends and receives; bytes measured ==
// the bytes sent to the other ranks
TEST_CASE("grouped ncclSend/ncclRecv: all-to-all with variable counts, a ring shift, to itself; no deadlock") {
    CommGroup g = comm_world_nccl(g_comm);
    int S = g.size, r = g.rank;
    auto count = [](int from, int to) { return (size_t)((from * 7 + to * 3) % 5); };   // 0 included
    auto v = [](int from, int to, size_t i) { return (int32_t)bits_of(from, (size_t)to * 1000 + i, 301); };
    std::vector<std::vector<int32_t>> out(S), in(S);
    uint64_t expect_bytes = 0;
    for (int p = 0; p < S; p++) {
        out[p].resize(count(r, p));
        for (size_t i = 0; i < out[p].size(); i++) out[p][i] = v(r, p, i);
        in[p].assign(count(p, r), -1);
        if (p != r) expect_bytes += out[p].size() * 4;
    }
    uint64_t b0 = nccl_twin_bytes_sent(g.nc);
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclGroupStart() == ncclSuccess);   // nested: the outermost end runs the group
    for (int p = 0; p < S; p++) {   // every receive posted after every send on every rank: fine inside a group
        CHECK(ncclSend(out[p].data(), out[p].size(), ncclInt32, p, g.nc, NULL) == ncclSuccess);
    }
    CHECK(settle(g.nc, ncclGroupEnd()) == ncclSuccess);
    for (int p = S - 1; p >= 0; p--) CHECK(ncclRecv(in[p].data(), in[p].size(), ncclInt32, p, g.nc, NULL) == ncclSuccess);
    CHECK(settle(g.nc, ncclGroupEnd()) == ncclSuccess);
    long bad = 0;
    for (int p = 0; p < S; p++)
        for (size_t i = 0; i < in[p].size(); i++) bad += in[p][i] != v(p, r, i);
    CHECK(bad == 0);
    CHECK(nccl_twin_bytes_sent(g.nc) - b0 == expect_bytes);
    // a ring shift, twice to the same peer (matched in order)
    std::vector<float> a(10, (float)r), b(10, (float)r + 0.5f), ra(10, -1.0f), rb(10, -1.0f);
    int right = (r + 1) % S, left = (r + S - 1) % S;
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclRecv(ra.data(), 10, ncclFloat32, left, g.nc, NULL) == ncclSuccess);
    CHECK(ncclRecv(rb.data(), 10, ncclFloat32, left, g.nc, NULL) == ncclSuccess);
    CHECK(ncclSend(a.data(), 10, ncclFloat32, right, g.nc, NULL) == ncclSuccess);
    CHECK(ncclSend(b.data(), 10, ncclFloat32, right, g.nc, NULL) == ncclSuccess);
    CHECK(settle(g.nc, ncclGroupEnd()) == ncclSuccess);
    CHECK(ra == std::vector<float>(10, (float)left));
    CHECK(rb == std::vector<float>(10, (float)left + 0.5f));
    // a send to itself without its receive is refused (NCCL would hang)
    g_nccl_twin_quiet = 1;
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(a.data(), 10, ncclFloat32, r, g.nc, NULL) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    g_nccl_twin_quiet = 0;
    comm_group_free(&g);
}

TEST_CASE("argument errors come back as NCCL's codes; no collective is started") {
    CommGroup g = comm_world_nccl(g_comm);
    std::vector<float> buf(64, 1.0f);
    g_nccl_twin_quiet = 1;   // the errors are expected: kept, not printed
    CHECK(ncclAllReduce(buf.data(), buf.data(), 4, (ncclDataType_t)42, ncclSum, g.nc, NULL) == ncclInvalidArgument);
    CHECK(ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat32, (ncclRedOp_t)9, g.nc, NULL) == ncclInvalidArgument);
    CHECK(ncclAllReduce(buf.data(), buf.data() + 1, 4, ncclFloat32, ncclSum, g.nc, NULL) == ncclInvalidArgument);   // overlap
    CHECK(ncclBroadcast(buf.data(), buf.data(), 4, ncclFloat32, g.size, g.nc, NULL) == ncclInvalidArgument);
    CHECK(ncclBroadcast(buf.data(), buf.data(), 4, ncclFloat32, -1, g.nc, NULL) == ncclInvalidArgument);
    CHECK(ncclSend(buf.data(), 4, ncclFloat32, g.size, g.nc, NULL) == ncclInvalidArgument);
    CHECK(ncclAllGather(buf.data() + 1, buf.data(), 4, ncclFloat32, g.nc, NULL) == ncclInvalidArgument);   // overlap, not in place
    CHECK(ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    ncclResult_t async = ncclInternalError;
    CHECK(ncclCommGetAsyncError(g.nc, &async) == ncclSuccess);
    CHECK(async == ncclSuccess);
    for (int e = 0; e < ncclNumResults; e++) CHECK(strlen(ncclGetErrorString((ncclResult_t)e)) > 0);
    CHECK(strstr(ncclGetLastError(NULL), "ncclGroupEnd without ncclGroupStart") != NULL);
    g_nccl_twin_quiet = 0;
    int dev = -1;
    CHECK(ncclCommCuDevice(g.nc, &dev) == ncclSuccess);
    CHECK(dev == 0);
    comm_group_free(&g);
}

// the id broadcast that comm_split does is needed: without it, or with one rank's id changed, every
// rank's ncclCommInitRank refuses (the same verdict everywhere: nobody is left waiting)
TEST_CASE("unique id: the same id is accepted; a mismatched, foreign or missing one is refused on every rank") {
    CommGroup& w = g_comm->world_group;
    int S = w.size, r = w.rank;
    g_nccl_twin_quiet = 1;
    ncclUniqueId id;
    if (r == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, w.mpi));
    ncclComm_t nc = NULL;
    nccl_twin_bootstrap(w.mpi);
    CHECK(ncclCommInitRank(&nc, S, id, r) == ncclSuccess);
    REQUIRE(nc != NULL);
    CHECK(ncclCommDestroy(nc) == ncclSuccess);
    // one rank (the last) holds a different id: refused everywhere (with one rank: an id no ncclGetUniqueId made)
    ncclUniqueId bad = id;
    if (r == S - 1) bad.internal[S > 1 ? 20 : 0] ^= 1;
    nccl_twin_bootstrap(w.mpi);
    nc = (ncclComm_t)&bad;
    CHECK(ncclCommInitRank(&nc, S, bad, r) == ncclInvalidArgument);
    CHECK(nc == NULL);
    // every rank made its own id (no broadcast)
    if (S > 1) {
        ncclUniqueId own;
        CHECK(ncclGetUniqueId(&own) == ncclSuccess);
        nccl_twin_bootstrap(w.mpi);
        CHECK(ncclCommInitRank(&nc, S, own, r) == ncclInvalidArgument);
    }
    // nranks or rank that do not match the bootstrap communicator
    nccl_twin_bootstrap(w.mpi);
    CHECK(ncclCommInitRank(&nc, S + (r == 0), id, r) == ncclInvalidArgument);
    nccl_twin_bootstrap(w.mpi);
    CHECK(ncclCommInitRank(&nc, S, id, S - 1 - r + (S == 1)) == ncclInvalidArgument);
    // no bootstrap communicator: the twin cannot connect
    CHECK(ncclCommInitRank(&nc, S, id, r) == ncclInvalidUsage);
    g_nccl_twin_quiet = 0;
    // and comm_split's own path still works after all that
    CommGroup g = comm_world_nccl(g_comm);
    int one = 1;
    comm_all_reduce(&g, &one, 1, COMM_I32);
    comm_sync(&g);
    CHECK(one == S);
    comm_group_free(&g);
}

// a communicator of the world's ranks made with the twin's API directly (not registered with comm.h)
static ncclComm_t make_comm(MPI_Comm mpi, ncclConfig_t* config, ncclResult_t want) {
    int S = 0, r = 0;
    MPI_CHECK(MPI_Comm_size(mpi, &S));
    MPI_CHECK(MPI_Comm_rank(mpi, &r));
    ncclUniqueId id;
    if (r == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi));
    ncclComm_t nc = NULL;
    nccl_twin_bootstrap(mpi);
    CHECK(ncclCommInitRankConfig(&nc, S, id, r, config) == want);
    return nc;
}

TEST_CASE("non-blocking communicator (ncclConfig_t.blocking = 0): ncclInProgress, polled to the end; blocking = 1 blocks") {
    CommGroup& w = g_comm->world_group;
    int S = w.size, r = w.rank;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = make_comm(w.mpi, &cfg, ncclInProgress);
    REQUIRE(nc != NULL);
    // while the state is ncclInProgress every call but the poll is refused (NCCL: undefined)
    float x = (float)(r + 1);
    g_nccl_twin_quiet = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, nc, NULL) == ncclInvalidUsage);
    CHECK(ncclCommFinalize(nc) == ncclInvalidUsage);
    g_nccl_twin_quiet = 0;
    CHECK(strstr(ncclGetLastError(NULL), "state is ncclInProgress") != NULL);
    CHECK(x == (float)(r + 1));   // nothing ran
    ncclResult_t st = ncclSuccess;
    CHECK(ncclCommGetAsyncError(nc, &st) == ncclSuccess);
    CHECK(st == ncclInProgress);
    CHECK(ncclCommGetAsyncError(nc, &st) == ncclSuccess);
    CHECK(st == ncclSuccess);
    CHECK(ncclCommGetAsyncError(nc, &st) == ncclSuccess);
    CHECK(st == ncclSuccess);   // final: it stays
    // a collective: ncclInProgress; polled to ncclSuccess, the result is there
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, nc, NULL) == ncclInProgress);
    CHECK(settle(nc, ncclInProgress) == ncclSuccess);
    CHECK(x == (float)(S * (S + 1) / 2));
    // a group: the operations inside return ncclSuccess, ncclGroupEnd ncclInProgress
    int right = (r + 1) % S, left = (r + S - 1) % S;
    float out = (float)r, in = -1.0f;
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(&out, 1, ncclFloat32, right, nc, NULL) == ncclSuccess);
    CHECK(ncclRecv(&in, 1, ncclFloat32, left, nc, NULL) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInProgress);
    CHECK(settle(nc, ncclInProgress) == ncclSuccess);
    CHECK(in == (float)left);
    // an argument error comes back from the call itself and leaves the state final
    g_nccl_twin_quiet = 1;
    CHECK(ncclAllReduce(&x, &x, 1, (ncclDataType_t)42, ncclSum, nc, NULL) == ncclInvalidArgument);
    g_nccl_twin_quiet = 0;
    CHECK(ncclCommGetAsyncError(nc, &st) == ncclSuccess);
    CHECK(st == ncclSuccess);
    // the orderly end: finalize (in progress, polled), then destroy
    CHECK(ncclCommFinalize(nc) == ncclInProgress);
    CHECK(settle(nc, ncclInProgress) == ncclSuccess);
    CHECK(ncclCommDestroy(nc) == ncclSuccess);
    // blocking = 1, and blocking left unset by NCCL_CONFIG_INITIALIZER: every call returns its result
    for (int blocking : {1, NCCL_CONFIG_UNDEF_INT}) {
        ncclConfig_t b = NCCL_CONFIG_INITIALIZER;
        b.blocking = blocking;
        ncclComm_t bc = make_comm(w.mpi, &b, ncclSuccess);
        REQUIRE(bc != NULL);
        float y = 1.0f;
        CHECK(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, bc, NULL) == ncclSuccess);
        CHECK(y == (float)S);
        CHECK(ncclCommFinalize(bc) == ncclSuccess);
        CHECK(ncclCommDestroy(bc) == ncclSuccess);
    }
    // a config not made by NCCL_CONFIG_INITIALIZER, or blocking 2: refused on every rank, nothing made
    g_nccl_twin_quiet = 1;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.blocking = 2;
    CHECK(make_comm(w.mpi, &bad, ncclInvalidArgument) == NULL);
    bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    CHECK(make_comm(w.mpi, &bad, ncclInvalidArgument) == NULL);
    g_nccl_twin_quiet = 0;
    nccl_twin_bootstrap(MPI_COMM_NULL);   // (the refused inits left it set)
}

// NCCL's abort semantics: a thread blocked in an operation of the communicator — on the null stream, or
// in a stream synchronisation that runs a deferred one — gives up when another thread calls
// ncclCommAbort, which returns once it has unwound. No twin watchdog is set: without the abort the
// operation would wait forever (the suite's timeout would fail it).
TEST_CASE("ncclCommAbort from another thread ends an operation blocked on a peer that never comes") {
    int W = g_comm->world, r = g_comm->rank;
    if (W < 2) return;
    // world ranks {W-1, 0}: world rank 0 waits for W-1, which never takes part
    int color = (r == 0 || r == W - 1) ? 0 : 1;
    MPI_Comm pair;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, r == W - 1 ? 0 : 1 + r, &pair));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if (color == 0) {
        for (int deferred = 0; deferred < 2; deferred++) {
            ncclComm_t nc = make_comm(pair, &cfg, ncclInProgress);
            REQUIRE(settle(nc, ncclInProgress) == ncclSuccess);
            if (r != 0) { CHECK(ncclCommAbort(nc) == ncclSuccess); MPI_CHECK(MPI_Barrier(pair)); continue; }
            nccl_twin_set_watchdog(NULL);
            cudaStream_t stream = NULL;
            if (deferred) REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
            double t0 = now_seconds(), aborted_at = 0;
            std::thread aborter([&]() {
                struct timespec ts = {0, 500000000};
                nanosleep(&ts, NULL);
                CHECK(ncclCommAbort(nc) == ncclSuccess);
                aborted_at = now_seconds() - t0;
            });
            std::vector<float> v(1000, 1.0f);
            g_nccl_twin_quiet = 1;
            ncclResult_t res = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, nc, stream);
            if (deferred) {   // issued at once; the stream's synchronisation runs it, and returns after the abort
                CHECK(res == ncclInProgress);
                CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
            } else {
                CHECK(res == ncclRemoteError);
            }
            double returned_at = now_seconds() - t0;
            aborter.join();
            g_nccl_twin_quiet = 0;
            INFO("deferred ", deferred, ": returned after ", returned_at, " s, the abort after ", aborted_at, " s");
            CHECK(returned_at >= 0.45);
            CHECK(returned_at < 3.0);
            CHECK(aborted_at >= 0.45);
            CHECK(aborted_at < 3.0);
            if (!deferred) CHECK(strstr(ncclGetLastError(NULL), "aborted (ncclCommAbort)") != NULL);
            // the communicator is gone for the caller: a new call is refused, not a hang
            g_nccl_twin_quiet = 1;
            CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, nc, NULL) == ncclInvalidUsage);
            g_nccl_twin_quiet = 0;
            if (stream) CHECK(cudaStreamDestroy(stream) == cudaSuccess);
            nccl_twin_set_watchdog(comm_nccl_twin_watchdog);
            MPI_CHECK(MPI_Barrier(pair));
        }
    }
    MPI_CHECK(MPI_Comm_free(&pair));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

static int g_watchdog_calls = 0, g_watchdog_peer = -1;
static double g_watchdog_waited = 0;
static std::string g_watchdog_op;
static void recording_watchdog(int peer, const char* op, double waited) {
    g_watchdog_calls++;
    g_watchdog_peer = peer;
    g_watchdog_op = op;
    g_watchdog_waited = waited;
}
static void aborting_watchdog(int peer, const char* op, double waited) {
    recording_watchdog(peer, op, waited);
    ncclCommAbort(nccl_twin_waiting_comm());
}

TEST_CASE("watchdog: called about once a second while a wait makes no progress, naming the world rank; ncclCommAbort") {
    int W = g_comm->world, r = g_comm->rank;
    if (W < 2) return;
    // a group of world ranks {W-1, 0} (group rank 0 is world rank W-1): world rank 0 receives from it
    // while it sleeps 1.5 s, so the name must be a world rank, not a group rank
    int color = (r == 0 || r == W - 1) ? 0 : 1;
    CommGroup g = comm_split(&g_comm->world_group, color, r == W - 1 ? 0 : 1 + r, "pair", 1);
    if (color == 0) {
        nccl_twin_set_watchdog(recording_watchdog);
        g_watchdog_calls = 0;
        float v = -1.0f;
        if (r == 0) {
            double t0 = MPI_Wtime();
            CHECK(settle(g.nc, ncclRecv(&v, 1, ncclFloat32, 0, g.nc, NULL)) == ncclSuccess);
            CHECK(MPI_Wtime() - t0 >= 1.4);
            CHECK(v == 42.0f);
            CHECK(g_watchdog_calls >= 1);
            CHECK(g_watchdog_peer == W - 1);
            CHECK(g_watchdog_op == "Send/Recv");
            CHECK(g_watchdog_waited >= 0.9);
        } else {
            struct timespec ts = {1, 500000000};
            nanosleep(&ts, NULL);
            v = 42.0f;
            CHECK(settle(g.nc, ncclSend(&v, 1, ncclFloat32, 1, g.nc, NULL)) == ncclSuccess);
        }
        // a watchdog that aborts and returns: the receive fails with ncclRemoteError, nothing hangs
        if (r == 0) {
            nccl_twin_set_watchdog(aborting_watchdog);
            g_watchdog_calls = 0;
            g_nccl_twin_quiet = 1;
            CHECK(ncclRecv(&v, 1, ncclFloat32, 0, g.nc, NULL) == ncclRemoteError);
            g_nccl_twin_quiet = 0;
            CHECK(strstr(ncclGetLastError(NULL), "aborted (ncclCommAbort)") != NULL);
            CHECK(g_watchdog_calls == 1);
            g.nccl = 0;   // aborted and freed: comm_group_free must not destroy it
        }
        nccl_twin_set_watchdog(comm_nccl_twin_watchdog);
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (g.nccl) CHECK(ncclCommAbort(g.nc) == ncclSuccess);   // the other side: abort without talking
    g.nccl = 0;
    comm_group_free(&g);
}

// ---------------------------------------------------------------------------------------------

// NCCL_TWIN_TEST_HANG: rank 1 stops itself before an all-reduce; rank 0's watchdog must end the job
static int hang_test(Comm* c) {
    comm_set_timeout(3);
    CommGroup g = comm_world_nccl(c);
    if (const char* f = getenv("NCCL_TWIN_TEST_PIDFILE")) {
        std::string path = std::string(f) + "." + std::to_string(c->rank);
        FILE* pf = fopen_check(path.c_str(), "w", __FILE__, __LINE__);
        fprintf(pf, "%d\n", (int)getpid());
        fclose_check(pf, path.c_str(), __FILE__, __LINE__);
    }
    std::vector<float> buf(1000, 1.0f);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (c->rank == 1) raise(SIGSTOP);
    comm_all_reduce(&g, buf.data(), buf.size(), COMM_F32);
    comm_sync(&g);
    fprintf(stderr, "error: rank %d: the all-reduce finished although rank 1 is stopped\n", c->rank);
    return 3;
}

int main(int argc, char** argv) {
    Comm comm = comm_init(&argc, &argv);
    g_comm = &comm;
    if (getenv("NCCL_TWIN_TEST_HANG")) return hang_test(&comm);
    if (comm.rank == 0) printf("NCCL twin and comm.h's NCCL path under the SIMT emulator: %d rank(s)\n", comm.world);
    std::ostringstream out;
    doctest::Context ctx(argc, argv);
    ctx.setOption("no-colors", true);
    ctx.setCout(&out);
    int rc = ctx.run();
    // every rank's report, printed by rank 0 in rank order: rank 0's whole, the others' summary lines,
    // or the whole of it when it failed (the failing checks name their rank)
    std::string mine = out.str();
    int len = (int)mine.size(), mine_rc = rc;
    std::vector<int> lens(comm.world), rcs(comm.world), offs(comm.world, 0);
    MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Gather(&mine_rc, 1, MPI_INT, rcs.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
    int total = 0;
    for (int i = 0; i < comm.world; i++) { offs[i] = total; total += lens[i]; }
    std::vector<char> all(total + 1);
    MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, MPI_COMM_WORLD));
    if (comm.rank == 0) {
        for (int i = 0; i < comm.world; i++) {
            std::istringstream text(std::string(all.data() + offs[i], lens[i]));
            std::string line;
            while (std::getline(text, line))
                if (i == 0 || rcs[i] != 0 || line.rfind("[doctest] test cases", 0) == 0) printf("rank %d: %s\n", i, line.c_str());
        }
        fflush(stdout);
    }
    int worst = 0;
    MPI_CHECK(MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    comm_finalize();
    return worst;
}
