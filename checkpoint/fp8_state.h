/*
 * fp8_state.h — THE SEAM between checkpoints and FP8 scaling: the model's FP8 operand state
 * (model/fp8.cuh: recipe, history length, margin, and per operand its scale and amax history) as one
 * JSON value in the manifest ("fp8"), and back. Delayed scaling carries state from step to step (the
 * next scale comes from the amax history), so a resume without it would not continue the run exactly.
 *
 * The state is the same on every rank (the amaxes are max-reduced over the world before
 * fp8_meta_step), so rank 0's copy is written. Floats are the shortest decimal that reads back as the
 * same float (json_float), so they round-trip bit for bit; a non-finite value (an inf amax) is written
 * as a string ("inf", "-inf", "nan"), which JSON numbers cannot hold.
 */
#pragma once
#include <cmath>
#include <string>
#include <vector>
#include "../model/dbrx.h"
#include "json.h"

static const char* const CKPT_FP8_RECIPES[4] = {"off", "delayed", "current", "block"};   // by Fp8Recipe

static inline std::string ckpt_fp8_float(float x) {
    if (std::isnan(x)) return "\"nan\"";
    if (std::isinf(x)) return x > 0 ? "\"inf\"" : "\"-inf\"";
    return json_float(x);
}

// reads what ckpt_fp8_float wrote, by the same conversion json_float checked it with
static inline bool ckpt_fp8_parse_float(const JsonValue* v, float* out) {
    if (v && v->kind == JsonValue::STR) {
        if (v->text == "nan") *out = NAN;
        else if (v->text == "inf") *out = INFINITY;
        else if (v->text == "-inf") *out = -INFINITY;
        else return false;
        return true;
    }
    double d;
    if (!json_double(v, &d)) return false;
    *out = (float)d;
    return true;
}

// The model's FP8 state as a JSON object (one line per operand). FP8 off: the recipe and no operands.
// cfg and metas are the model's on either backend (dbrx_fp8_metas of a Dbrx or a DbrxGPU: the same
// names in the same order); cfg NULL: FP8 off.
static inline std::string ckpt_fp8_state_json(const Fp8Config* cfg, const std::vector<Fp8MetaRef>& metas) {
    Fp8Config off = {FP8_OFF, 16, 0, 0};
    if (!cfg) cfg = &off;
    char b[256];
    snprintf(b, sizeof b, "{\"recipe\": \"%s\", \"amax_history_len\": %d, \"margin\": %d, \"metas\": [",
             CKPT_FP8_RECIPES[cfg->recipe], cfg->history_len, cfg->margin);
    std::string s = b;
    for (size_t i = 0; i < metas.size(); i++) {
        const Fp8Meta* mt = metas[i].meta;
        s += "\n    {\"name\": " + json_quote(metas[i].name) + ", \"scale\": " + ckpt_fp8_float(mt->scale) +
             ", \"filled\": " + std::to_string(mt->filled) + ", \"amax_history\": [";
        for (int k = 0; k < mt->filled; k++) s += (k ? ", " : "") + ckpt_fp8_float(mt->history[k]);
        s += i + 1 < metas.size() ? "]}," : "]}";
    }
    return s + (metas.empty() ? "]}" : "\n  ]}");
}

// One operand's saved state, parsed.
typedef struct { std::string name; float scale; std::vector<float> history; } CkptFp8Meta;

// Restores the model's FP8 state from the manifest's "fp8" value (NULL: a checkpoint from before it
// was saved). Returns "" or what is malformed (the checkpoint is then treated as damaged); nothing is
// changed unless the whole value is well-formed. Lines for the reader about what could not be carried
// over (another recipe, history length or margin; no state saved) are appended to *notes.
static inline std::string ckpt_fp8_state_restore(const Fp8Config* cfg, const std::vector<Fp8MetaRef>& metas,
                                                 const JsonValue* fp8, std::string* notes) {
    Fp8Config off = {FP8_OFF, 16, 0, 0};
    const Fp8Config* run = cfg ? cfg : &off;
    const char* run_name = CKPT_FP8_RECIPES[run->recipe];
    if (!fp8) {
        if (run->recipe == FP8_DELAYED)
            *notes += "note: resume: the checkpoint holds no FP8 scaling state (saved before it was): the amax histories start empty\n";
        return "";
    }
    // parse and check everything first
    const JsonValue* rv = json_get(fp8, "recipe");
    const JsonValue* list = json_get(fp8, "metas");
    int recipe = -1, hlen = 0, margin = 0;
    for (int r = 0; rv && rv->kind == JsonValue::STR && r < 4; r++) if (rv->text == CKPT_FP8_RECIPES[r]) recipe = r;
    if (recipe < 0) return "manifest.json: fp8: no known recipe";
    if (!json_int(json_get(fp8, "amax_history_len"), &hlen) || hlen < 1 || hlen > FP8_MAX_HISTORY ||
        !json_int(json_get(fp8, "margin"), &margin) || margin < 0 || !list || list->kind != JsonValue::ARR)
        return "manifest.json: fp8: amax_history_len, margin or metas missing or out of range";
    std::vector<CkptFp8Meta> saved(list->items.size());
    for (size_t i = 0; i < saved.size(); i++) {
        const JsonValue* e = &list->items[i];
        const JsonValue* nm = json_get(e, "name");
        const JsonValue* h = json_get(e, "amax_history");
        int filled = -1;
        std::string where = "manifest.json: fp8: metas[" + std::to_string(i) + "]";
        if (!nm || nm->kind != JsonValue::STR || !ckpt_fp8_parse_float(json_get(e, "scale"), &saved[i].scale) ||
            !json_int(json_get(e, "filled"), &filled) || !h || h->kind != JsonValue::ARR)
            return where + ": name, scale, filled or amax_history missing";
        if (filled < 0 || filled > hlen || (size_t)filled != h->items.size())
            return where + ": filled " + std::to_string(filled) + " disagrees with its history or amax_history_len";
        saved[i].name = nm->text;
        saved[i].history.resize(filled);
        for (int k = 0; k < filled; k++)
            if (!ckpt_fp8_parse_float(&h->items[k], &saved[i].history[k])) return where + ": amax_history holds a non-number";
    }
    if (recipe == run->recipe && saved.size() != metas.size())
        return "manifest.json: fp8: " + std::to_string(saved.size()) + " operands, the model has " + std::to_string(metas.size());
    for (size_t i = 0; recipe == run->recipe && i < metas.size(); i++)
        if (saved[i].name != metas[i].name) return "manifest.json: fp8: operand " + std::to_string(i) + " is " + saved[i].name +
                                                   ", the model's is " + metas[i].name;
    // carry over what applies
    if (recipe != run->recipe) {
        if (recipe != FP8_OFF || run->recipe != FP8_OFF)
            *notes += std::string("note: resume: the checkpoint was saved with --fp8 ") + CKPT_FP8_RECIPES[recipe] + ", this run uses --fp8 " +
                      run_name + (run->recipe == FP8_DELAYED ? ": the amax histories start empty\n"
                                  : recipe == FP8_DELAYED ? ": its delayed-scaling state is not used\n" : "\n");
        return "";
    }
    if (recipe != FP8_DELAYED) return "";   // current and block scaling keep nothing from step to step
    bool rescale = hlen != run->history_len || margin != run->margin;
    if (hlen != run->history_len) {
        int keep = hlen < run->history_len ? hlen : run->history_len;
        *notes += "note: resume: --fp8-amax-history is " + std::to_string(run->history_len) + ", the checkpoint's was " +
                  std::to_string(hlen) + ": each amax history keeps its newest " + std::to_string(keep) + " entries\n";
    }
    if (margin != run->margin)
        *notes += "note: resume: --fp8-margin is " + std::to_string(run->margin) + ", the checkpoint's was " + std::to_string(margin) +
                  ": the scales are derived again from the amax histories\n";
    for (size_t i = 0; i < metas.size(); i++) {
        Fp8Meta* mt = metas[i].meta;
        const std::vector<float>& h = saved[i].history;
        size_t drop = h.size() > (size_t)run->history_len ? h.size() - run->history_len : 0;   // the oldest go
        fp8_meta_init(mt);
        mt->filled = (int)(h.size() - drop);
        for (int k = 0; k < mt->filled; k++) mt->history[k] = h[drop + k];
        mt->scale = saved[i].scale;
        if (rescale && mt->filled > 0) {   // what fp8_meta_step would have set with these settings
            float hmax = 0;
            for (int k = 0; k < mt->filled; k++) hmax = std::fmax(hmax, mt->history[k]);
            mt->scale = fp8_scale_for(hmax, metas[i].fmt, run->margin);
        }
    }
    return "";
}

// the CPU model's state (the tests)
static inline std::string ckpt_fp8_state_json(Dbrx* m) { return ckpt_fp8_state_json(&m->fp8, dbrx_fp8_metas(m)); }
static inline std::string ckpt_fp8_state_restore(Dbrx* m, const JsonValue* fp8, std::string* notes) {
    return ckpt_fp8_state_restore(&m->fp8, dbrx_fp8_metas(m), fp8, notes);
}
