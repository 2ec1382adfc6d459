/*
 * spike_guard.h — the loss-spike and NaN guard of the training loop: decides, before the update, whether
 * a step is applied or skipped, and keeps the statistics it decides by (saved in checkpoints, so that a
 * resumed run decides as the uninterrupted one would).
 *
 * A step is skipped (no update; the data position moves on) when
 *   - its loss (mean cross-entropy over the ranks), aux losses or gradient norm is not finite — always;
 *   - its loss exceeds the mean of the losses of the last `window` applied steps by sigma * their std and
 *     by `loss_rise` x the mean (--spike-loss-sigma, 0: off; --spike-loss-rise, default 1: the loss
 *     doubled), once at least min(window, 10) steps are in it. The rise is the real test: per-batch losses
 *     are heavy-tailed (a batch of an unusual document), so on a plateau an ordinary step reaches any
 *     number of standard deviations (measured on the default data: z 11, +51% at batch 1), while a
 *     divergence more than triples the loss (checkpoint/README.md, "The spike guard": the measurement);
 *   - its gradient norm exceeds factor * the median of the last `window` applied steps' norms
 *     (--spike-gnorm-factor, default 50, 0: off; an ordinary batch of the default run reached 18x, and the
 *     gradient clip bounds such a step's update anyway), once as many are in it.
 * Only applied steps enter the statistics, so a spike never raises the bar for the next one. After
 * max_skips skipped steps among the last `window` steps the run stops (the loop's choice, documented in
 * the README: it does not save the state it has, points `latest` at the newest confirmed checkpoint and
 * sets the newer ones aside; a restart resumes from there).
 * Every rank sees the same loss and norm (both are all-reduced), so every rank decides the same.
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <vector>
#include "json.h"

typedef struct {
    float loss_sigma, gnorm_factor;   // thresholds (0: that test off)
    float loss_rise;                   // the loss test also needs loss > (1 + loss_rise) x the mean
    int window, max_skips;
    std::deque<double> losses, gnorms; // the last `window` applied steps
    std::deque<int> skipped;           // steps skipped among the last `window` steps
} SpikeGuard;

static inline void spike_guard_init(SpikeGuard* g, float loss_sigma, float gnorm_factor, int window, int max_skips, float loss_rise) {
    g->loss_sigma = loss_sigma; g->gnorm_factor = gnorm_factor; g->window = window; g->max_skips = max_skips;
    g->loss_rise = loss_rise;
    g->losses.clear(); g->gnorms.clear(); g->skipped.clear();
}

static inline int spike_guard_min_history(const SpikeGuard* g) { return g->window < 10 ? g->window : 10; }

// "" if the step may be applied, else why it is skipped (one line)
static inline std::string spike_guard_check(const SpikeGuard* g, double loss, double aux, double gnorm) {
    char b[256];
    if (!std::isfinite(loss) || !std::isfinite(aux) || !std::isfinite(gnorm)) {
        snprintf(b, sizeof b, "not finite: loss %g, aux losses %g, grad norm %g", loss, aux, gnorm);
        return b;
    }
    if ((int)g->losses.size() < spike_guard_min_history(g)) return "";
    if (g->loss_sigma > 0) {
        double mean = 0, var = 0;
        for (double x : g->losses) mean += x;
        mean /= g->losses.size();
        for (double x : g->losses) var += (x - mean) * (x - mean);
        double sd = sqrt(var / g->losses.size()), margin = std::max(g->loss_sigma * sd, g->loss_rise * std::fabs(mean));
        if (loss > mean + margin) {
            snprintf(b, sizeof b, "loss spike: %.6g > mean %.6g + max(%g x std %.3g, %g x mean) of the last %zu steps", loss, mean,
                     g->loss_sigma, sd, g->loss_rise, g->losses.size());
            return b;
        }
    }
    if (g->gnorm_factor > 0) {
        std::vector<double> s(g->gnorms.begin(), g->gnorms.end());
        std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
        double med = s[s.size() / 2];
        if (gnorm > g->gnorm_factor * med) {
            snprintf(b, sizeof b, "grad norm spike: %.6g > %g x median %.6g of the last %zu steps", gnorm, g->gnorm_factor, med,
                     g->gnorms.size());
            return b;
        }
    }
    return "";
}

// the step's outcome into the statistics; returns true when the skips in the window reach max_skips
static inline bool spike_guard_record(SpikeGuard* g, int step, bool skipped, double loss, double gnorm) {
    while (!g->skipped.empty() && g->skipped.front() <= step - g->window) g->skipped.pop_front();
    if (skipped) {
        g->skipped.push_back(step);
        return (int)g->skipped.size() >= g->max_skips;
    }
    g->losses.push_back(loss); g->gnorms.push_back(gnorm);
    while ((int)g->losses.size() > g->window) { g->losses.pop_front(); g->gnorms.pop_front(); }
    return false;
}

// the statistics as a JSON object for the checkpoint manifest (exact: %.17g), and back
static inline std::string spike_guard_json(const SpikeGuard* g) {
    std::string s = "{\"losses\": [";
    char b[64];
    for (size_t i = 0; i < g->losses.size(); i++) { snprintf(b, sizeof b, "%s%.17g", i ? ", " : "", g->losses[i]); s += b; }
    s += "], \"grad_norms\": [";
    for (size_t i = 0; i < g->gnorms.size(); i++) { snprintf(b, sizeof b, "%s%.17g", i ? ", " : "", g->gnorms[i]); s += b; }
    s += "], \"skipped\": [";
    for (size_t i = 0; i < g->skipped.size(); i++) { snprintf(b, sizeof b, "%s%d", i ? ", " : "", g->skipped[i]); s += b; }
    return s + "]}";
}

// Restores what spike_guard_json wrote (text: the JSON value). A window shorter than the saved one keeps
// the newest entries. Returns "" or what is malformed.
static inline std::string spike_guard_restore(SpikeGuard* g, const std::string& text) {
    JsonValue v;
    std::string err;
    if (!json_parse(text.data(), text.size(), &v, &err)) return "guard: " + err;
    const JsonValue *l = json_get(&v, "losses"), *n = json_get(&v, "grad_norms"), *s = json_get(&v, "skipped");
    if (!l || !n || !s || l->kind != JsonValue::ARR || n->kind != JsonValue::ARR || s->kind != JsonValue::ARR ||
        l->items.size() != n->items.size())
        return "guard: losses, grad_norms and skipped must be arrays, the first two of one length";
    std::deque<double> losses, gnorms;
    std::deque<int> skipped;
    for (size_t i = 0; i < l->items.size(); i++) {
        double a, b;
        if (!json_double(&l->items[i], &a) || !json_double(&n->items[i], &b) || !std::isfinite(a) || !std::isfinite(b))
            return "guard: a loss or grad norm is not a finite number";
        losses.push_back(a); gnorms.push_back(b);
    }
    for (const JsonValue& x : s->items) {
        int k;
        if (!json_int(&x, &k)) return "guard: skipped holds a non-integer";
        skipped.push_back(k);
    }
    while ((int)losses.size() > g->window) { losses.pop_front(); gnorms.pop_front(); }
    g->losses = losses; g->gnorms = gnorms; g->skipped = skipped;
    return "";
}
