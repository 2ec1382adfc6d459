/*
 * attention_ring.h — the arithmetic of ring attention (context parallelism, --context-parallel N), CPU:
 * the causal GQA attention of this rank's query tokens over one block of keys and values at a time,
 * merged with the online softmax, and its backward. No communication here (model/ never names the
 * communicator): parallel/context_parallel.h passes the blocks around the ring and calls these.
 *
 * Causal load balancing: a sequence of T tokens is cut into 2N chunks of c = T / (2N); CP rank r holds
 * chunks r and 2N-1-r, local rows [0, c) and [c, 2c) (Tl = 2c = T / N rows per sequence). Chunk g of the
 * queries attends to chunk g' of the keys fully when g' < g, causally (the diagonal) when g' = g, and
 * not at all when g' > g: rank r's chunks see r and 2N-1-r earlier chunks and one diagonal each, so every
 * rank does the same 2N-1 full chunk pairs and 2 diagonals (contiguous chunks would leave rank N-1 with
 * 4N-3 and rank 0 with 1).
 *
 * The contract is the kernels': the forward keeps out (B, Tl, H*hd) and lse (B, H, Tl), the logsumexp
 * of every row's scaled scores over ALL its keys (merged over the blocks); the backward recomputes
 * p = exp(scale q.k - lse) block by block with that lse and D = rowsum(dout * out).
 *   kv block (B, Tl, 2*KV*hd): row = [K: KV*hd | V: KV*hd] of one rank's tokens, in its local order
 */
#pragma once
#include <vector>
#include "attention.cuh"

// Context parallelism (--context-parallel n > 1: parallel/context_parallel.h): this rank holds T / n of each
// sequence's tokens and the attention runs over the whole sequence as ring attention; NULL: the local causal
// attention. The model's contract: out (B, T, H*hd) and lse (B, H, T) from qkv (after clip and RoPE);
// dqkv (overwritten) from dout. Collective over the CP group: every CP rank calls it, layer by layer.
// The load-balancing loss of a whole sequence needs the expert counts and probability sums of all its tokens:
// lbl (NULL: each rank's own tokens, as under data parallelism) returns layer l's loss over the CP group's tokens
// (lbl_forward's formula at n N tokens) and keeps the group's counts; lbl_counts gives the backward those counts and
// the weight / n (each of the n ranks' gradients then adds up to the whole sequences' loss's, as one process's).
typedef struct {
    void (*forward)(void* ctx, real* out, real* lse, const real* qkv);
    void (*backward)(void* ctx, real* dqkv, const real* dout, const real* qkv, const real* out, const real* lse);
    double (*lbl)(void* ctx, int l, const real* probs, const int* counts, int N, int E, int k, int L, float weight);
    float (*lbl_counts)(void* ctx, int l, float weight, const int** counts);
    double (*batch)(void* ctx, const int* inputs);   // (NULL: none) a forward's tokens (B, Tl), before its first layer: --doc-mask's
                                                   // documents span the group's chunks (cp_doc_starts)
    void* ctx;
} AttentionHooks;

// the causal attention of qkv (after clip and RoPE): the local one (doc: the document mask, attention.cuh), or the CP
// group's ring attention (which takes the documents from its batch hook)
static inline void attention_hooked_forward(const AttentionHooks* hk, real* out, real* lse, const real* qkv, int B, int T, int H, int KV,
                                            int hd, DocMask doc) {
    if (hk->forward) hk->forward(hk->ctx, out, lse, qkv);
    else attention_forward(out, lse, qkv, B, T, H, KV, hd, doc);
}
static inline void attention_hooked_backward(const AttentionHooks* hk, real* dqkv, const real* dout, const real* qkv, const real* out,
                                             const real* lse, int B, int T, int H, int KV, int hd, DocMask doc) {
    if (hk->backward) hk->backward(hk->ctx, dqkv, dout, qkv, out, lse);
    else attention_backward(dqkv, dout, qkv, lse, B, T, H, KV, hd, doc);
}

// the global chunk (of 2n) that local chunk i (0 or 1) of CP rank r holds; balance 0: contiguous chunks
// (rank r holds 2r and 2r+1: the unbalanced layout, kept for the tests' negative control)
static inline int cp_chunk(int r, int i, int n, int balance) { return balance ? (i == 0 ? r : 2 * n - 1 - r) : 2 * r + i; }

// the global position of every local row (Tl = T / n): RoPE rotates by these
static inline void cp_positions(int* pos, int T, int n, int r, int balance) {
    int c = T / (2 * n);
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < c; t++) pos[i * c + t] = cp_chunk(r, i, n, balance) * c + t;
}

// rope tables (Tl, hd/2) for the given positions: the values of rope_tables' rows pos[t], bit for bit
static inline void rope_tables_at(real* cos_t, real* sin_t, const int* pos, int Tl, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float inv_freq = rope_inv_freq(i, hd, theta);
        for (int t = 0; t < Tl; t++) {
            float angle = (float)pos[t] * inv_freq;
            cos_t[(size_t)t * half + i] = (real)(float)std::cos((double)angle);
            sin_t[(size_t)t * half + i] = (real)(float)std::sin((double)angle);
        }
    }
}

// --doc-mask under context parallelism (model/attention.cuh's document mask): qstart (B, Tl) = the global position of the
// first token of each local row's document, from every CP rank's local inputs all (n, B, Tl) (rank s's row i at global
// position chunk(s, i / c) c + i % c): the ring's masks compare it with a key's global position. Returns the share of the
// causal (query, key) pairs of this rank's rows that the mask keeps (MFU: model/config.h; every rank's rows hold the same
// causal pairs, chunks r and 2N-1-r, so the group's share is the mean of its ranks')
static inline double cp_doc_starts(int* qstart, const int* all, int n, int rank, int B, int Tl, int eot) {
    int T = n * Tl, c = Tl / 2;
    std::vector<int> seq(T), start(T);
    double kept = 0, causal = 0;
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < n; s++)
            for (int i = 0; i < Tl; i++) seq[cp_chunk(s, i / c, n, 1) * c + i % c] = all[((size_t)s * B + b) * Tl + i];
        for (int t = 0, st = 0; t < T; t++) { if (seq[t] == eot) st = t; start[t] = st; }
        for (int i = 0; i < Tl; i++) {
            int t = cp_chunk(rank, i / c, n, 1) * c + i % c;
            qstart[(size_t)b * Tl + i] = start[t];
            kept += t - start[t] + 1;
            causal += t + 1;
        }
    }
    return causal > 0 ? kept / causal : 1.0;
}

// kv (B, Tl, 2*KV*hd) = the K|V columns of qkv (B, Tl, qkv_dim)
static inline void ring_pack_kv(real* kv, const real* qkv, size_t rows, int H, int KV, int hd) {
    int qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd;
    for (size_t i = 0; i < rows; i++) memcpy(kv + i * kvw, qkv + i * qd + H * hd, (size_t)kvw * sizeof(real));
}
// the K|V columns of dqkv (B, Tl, qkv_dim) = dkv (the rest of dqkv untouched)
static inline void ring_unpack_dkv(real* dqkv, const real* dkv, size_t rows, int H, int KV, int hd) {
    int qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd;
    for (size_t i = 0; i < rows; i++) memcpy(dqkv + i * qd + H * hd, dkv + i * kvw, (size_t)kvw * sizeof(real));
}

// merges a partial result (o_p, lse_p) over some keys into the accumulated (o, lse) over others:
//   lse' = log(exp lse + exp lse_p);  o' = o exp(lse - lse') + o_p exp(lse_p - lse').  lse = -inf: nothing yet
static inline void ring_merge(real* o, real* lse, const real* o_p, real lse_p, int hd) {
    if (*lse == -INFINITY) { memcpy(o, o_p, (size_t)hd * sizeof(real)); *lse = lse_p; return; }
    real m = std::fmax(*lse, lse_p);
    real l = m + std::log(std::exp(*lse - m) + std::exp(lse_p - m));
    real a = std::exp(*lse - l), b = std::exp(lse_p - l);
    for (int i = 0; i < hd; i++) o[i] = o[i] * a + o_p[i] * b;
    *lse = l;
}

// One ring step's forward: this rank's queries (qkv, chunks gq[0], gq[1]) over the block kv of the rank
// holding chunks gk[0], gk[1], merged into out/lse. Before the first step out = 0, lse = -inf (ring_begin).
// The merge order (the ring's step order, then the key chunk) is fixed: deterministic. qstart (B, Tl; NULL: none): the
// document mask, each row's document's first global position (cp_doc_starts): a key chunk's keys before it are not seen
static inline void attention_ring_forward(real* out, real* lse, const real* qkv, const real* kv, int B, int Tl, int H, int KV, int hd,
                                          const int gq[2], const int gk[2], const int* qstart = nullptr) {
    int qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd, group = H / KV, C = H * hd, c = Tl / 2;
    real scale = (real)1 / std::sqrt((real)hd);
    #pragma omp parallel
    {
        real* p = (real*)mallocCheck((size_t)c * sizeof(real));
        real* o = (real*)mallocCheck((size_t)hd * sizeof(real));
        #pragma omp for collapse(3)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int t = 0; t < Tl; t++) {
                    int qi = t / c, tt = t % c, kvh = h / group;
                    for (int ki = 0; ki < 2; ki++) {
                        if (gk[ki] > gq[qi]) continue;   // a later chunk: masked whole
                        int n = gk[ki] == gq[qi] ? tt + 1 : c;
                        int lo = qstart ? std::max(0, qstart[(size_t)b * Tl + t] - gk[ki] * c) : 0;   // (the document mask)
                        if (lo >= n) continue;   // the chunk lies before the row's document
                        const real* k0 = kv + ((size_t)b * Tl + (size_t)ki * c + lo) * kvw + kvh * hd;
                        real lp = attention_row(o, p, qkv + ((size_t)b * Tl + t) * qd + h * hd, k0, k0 + KV * hd, kvw, n - lo, hd, scale);
                        ring_merge(out + ((size_t)b * Tl + t) * C + h * hd, lse + ((size_t)b * H + h) * Tl + t, o, lp, hd);
                    }
                }
        free(p);
        free(o);
    }
}

static inline void attention_ring_begin(real* out, real* lse, int B, int Tl, int H, int hd) {
    memset(out, 0, (size_t)B * Tl * H * hd * sizeof(real));
    for (size_t i = 0; i < (size_t)B * H * Tl; i++) lse[i] = -INFINITY;
}

// D (B, H, Tl) = rowsum(dout * out) per query head: the backward's sum over all keys of p * dp
static inline void attention_ring_rowdot(real* D, const real* dout, const real* out, int B, int Tl, int H, int hd) {
    int C = H * hd;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < Tl; t++) {
                const real* y = out + ((size_t)b * Tl + t) * C + h * hd;
                const real* dy = dout + ((size_t)b * Tl + t) * C + h * hd;
                real s = 0;
                for (int i = 0; i < hd; i++) s += dy[i] * y[i];
                D[((size_t)b * H + h) * Tl + t] = s;
            }
}

// One ring step's backward: this rank's queries over the block kv (chunks gk), with the merged lse and D:
//   p = exp(scale q.k - lse);  dv += p dout;  dp = dout . v;  ds = p (dp - D);  dq += scale ds k;  dk += scale ds q
// dq accumulates into the Q columns of dqkv (B, Tl, qkv_dim); dk, dv into dkv (B, Tl, 2*KV*hd), the block's
// gradient that travels with it. One thread per (b, kv head): it owns those dk/dv rows and its heads' dq.
static inline void attention_ring_backward(real* dqkv, real* dkv, const real* dout, const real* qkv, const real* kv, const real* lse,
                                           const real* D, int B, int Tl, int H, int KV, int hd, const int gq[2], const int gk[2],
                                           const int* qstart = nullptr) {
    int qd = (H + 2 * KV) * hd, kvw = 2 * KV * hd, group = H / KV, C = H * hd, c = Tl / 2;
    real scale = (real)1 / std::sqrt((real)hd);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int kvh = 0; kvh < KV; kvh++)
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int t = 0; t < Tl; t++) {
                    int qi = t / c, tt = t % c;
                    size_t row = (size_t)b * Tl + t, lr = ((size_t)b * H + h) * Tl + t;
                    const real* q = qkv + row * qd + h * hd;
                    const real* dy = dout + row * C + h * hd;
                    real* dq = dqkv + row * qd + h * hd;
                    for (int ki = 0; ki < 2; ki++) {
                        if (gk[ki] > gq[qi]) continue;
                        int n = gk[ki] == gq[qi] ? tt + 1 : c;
                        int lo = qstart ? std::max(0, qstart[(size_t)b * Tl + t] - gk[ki] * c) : 0;   // (the document mask)
                        for (int t2 = lo; t2 < n; t2++) {
                            size_t krow = (size_t)b * Tl + (size_t)ki * c + t2;
                            const real* k = kv + krow * kvw + kvh * hd;
                            const real* v = k + KV * hd;
                            real* dk = dkv + krow * kvw + kvh * hd;
                            real* dv = dk + KV * hd;
                            real s = 0, dp = 0;
                            for (int i = 0; i < hd; i++) { s += q[i] * k[i]; dp += dy[i] * v[i]; }
                            real pr = std::exp(s * scale - lse[lr]);
                            real ds = pr * (dp - D[lr]) * scale;
                            for (int i = 0; i < hd; i++) { dv[i] += pr * dy[i]; dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                        }
                    }
                }
}
