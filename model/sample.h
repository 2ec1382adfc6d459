/*
 * sample.h — the next token from one position's logits: greedy (temperature 0) or a draw from
 * softmax(logits / temperature), optionally over the top_k largest logits only, from the project's seeded
 * splitmix64 stream (model/common.h's Rng: the same seed gives the same text on every machine).
 *
 * Only the ids the tokenizer can turn into text take part (`valid`): the vocabulary is padded beyond the
 * tokenizer's ids (dbrx-tiny: 257 byte-level ids in 384 rows; DBRX: 100280 in 100352), and the padding
 * rows, never a training target, are never sampled. Ties go to the lower id (greedy), as the router's top-k.
 */
#pragma once
#include <algorithm>
#include <vector>
#include "common.h"

// the valid id with the largest logit (the lower id on ties); valid == NULL: every id
static inline int sample_argmax(const float* logits, int V, const unsigned char* valid) {
    int best = -1;
    for (int i = 0; i < V; i++)
        if ((!valid || valid[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return best;
}

// temperature 0: sample_argmax. Else p_i ∝ exp((z_i - max z) / temperature) over the valid ids, restricted
// to the top_k largest logits when top_k > 0 (ties at the k-th value: the lower ids), one uniform draw of
// rng against the cumulative sums (in double, in id order).
static inline int sample_token(const float* logits, int V, const unsigned char* valid, float temperature, int top_k, Rng* rng) {
    if (temperature == 0.0f) return sample_argmax(logits, V, valid);
    std::vector<int> ids;
    ids.reserve(V);
    for (int i = 0; i < V; i++) if (!valid || valid[i]) ids.push_back(i);
    if (ids.empty()) return -1;
    if (top_k > 0 && top_k < (int)ids.size()) {
        // the k largest (larger logit first, the lower id on ties), then back into id order
        auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
        std::nth_element(ids.begin(), ids.begin() + top_k, ids.end(), before);
        ids.resize(top_k);
        std::sort(ids.begin(), ids.end());
    }
    double maxz = -INFINITY;
    for (int i : ids) maxz = std::max(maxz, (double)logits[i]);
    std::vector<double> p(ids.size());
    double sum = 0;
    for (size_t j = 0; j < ids.size(); j++) { p[j] = std::exp(((double)logits[ids[j]] - maxz) / temperature); sum += p[j]; }
    double u = rng_uniform(rng) * sum, acc = 0;
    for (size_t j = 0; j < ids.size(); j++) {
        acc += p[j];
        if (u < acc) return ids[j];
    }
    return ids.back();   // (u within rounding of the total)
}
