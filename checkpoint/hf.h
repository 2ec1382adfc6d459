/*
 * hf.h — Hugging Face interop: export the weights as config.json + safetensors in the
 * DbrxForCausalLM layout and names (BF16 or FP32), and import them (to fine-tune a DBRX checkpoint).
 * Neither direction ever holds the whole model on one rank:
 *   import: every rank reads the safetensors headers, then for each tensor only the bytes of its own
 *           shard (pread), converting to fp32;
 *   export: rank 0 lays out the files (headers, sizes), then every rank of the first replica writes its
 *           pieces of every tensor in place (pwrite), converting to the export dtype.
 * The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data
 * (offsets relative to the end of the header). Files over --export-max-file-gb are split as the Hub
 * does: model-0000i-of-0000n.safetensors + model.safetensors.index.json. FP32 export -> import is bit-exact.
 * Also st_write_host: a small safetensors file from host buffers (the --dump-logits output).
 */
#pragma once
#include <map>
#include <string>
#include <vector>
#include "../model/dbrx.h"
#include "../parallel/comm.h"
#include "../parallel/zero.h"
#include "files.h"
#include "json.h"

typedef struct {
    std::string name, dtype, file;
    std::vector<int64_t> shape;
    uint64_t begin, end;          // relative to the data section
    uint64_t data_start;          // 8 + header length
} StTensor;

static inline size_t st_dtype_bytes(const std::string& dt) {
    return dt == "F32" || dt == "I32" ? 4 : dt == "BF16" || dt == "F16" ? 2 : dt == "F64" || dt == "I64" ? 8 : 0;
}

// the header of one safetensors file; "" or what is wrong with it
static inline std::string st_read_header(const std::string& path, std::map<std::string, StTensor>* out) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return sys_err("open " + path);
    struct stat st;
    fstat(fd, &st);
    uint64_t n = 0;
    std::string err = pread_all(fd, &n, 8, 0, path);
    if (err.empty() && (n == 0 || n > ((uint64_t)100 << 20) || 8 + n > (uint64_t)st.st_size))
        err = path + ": not a safetensors file (header length " + std::to_string(n) + ")";
    std::string text;
    if (err.empty()) { text.resize(n); err = pread_all(fd, &text[0], n, 8, path); }
    close(fd);
    if (!err.empty()) return err;
    JsonValue h;
    std::string perr;
    if (!json_parse(text.data(), text.size(), &h, &perr) || h.kind != JsonValue::OBJ) return path + ": header: " + perr;
    uint64_t data_bytes = (uint64_t)st.st_size - 8 - n;
    for (size_t i = 0; i < h.keys.size(); i++) {
        if (h.keys[i] == "__metadata__") continue;
        const JsonValue* t = &h.items[i];
        StTensor x;
        x.name = h.keys[i]; x.file = path; x.data_start = 8 + n;
        const JsonValue* dt = json_get(t, "dtype");
        const JsonValue* sh = json_get(t, "shape");
        const JsonValue* of = json_get(t, "data_offsets");
        if (!dt || !sh || sh->kind != JsonValue::ARR || !of || of->kind != JsonValue::ARR || of->items.size() != 2 ||
            !json_u64(&of->items[0], &x.begin) || !json_u64(&of->items[1], &x.end))
            return path + ": tensor " + x.name + ": malformed entry";
        x.dtype = dt->text;
        uint64_t numel = 1;
        for (const JsonValue& d : sh->items) {
            uint64_t v;
            if (!json_u64(&d, &v)) return path + ": tensor " + x.name + ": bad shape";
            x.shape.push_back((int64_t)v);
            numel *= v;
        }
        size_t es = st_dtype_bytes(x.dtype);
        if (es == 0) return path + ": tensor " + x.name + ": unsupported dtype " + x.dtype;
        if (x.end < x.begin || x.end - x.begin != numel * es || x.end > data_bytes)
            return path + ": tensor " + x.name + ": data_offsets [" + std::to_string(x.begin) + ", " + std::to_string(x.end) +
                   ") do not fit its shape and dtype or the file";
        (*out)[x.name] = x;
    }
    return "";
}

// the safetensors files of a directory without an index: the Hub's shards model-<i>-of-<n>.safetensors
// (all n of them, i = 1..n, with the digits the names use) if there are any, else every *.safetensors
// file; "" or what is missing
static inline std::string st_list_unindexed(const std::string& dir, std::vector<std::string>* files, std::string* how) {
    DIR* d = opendir(dir.c_str());
    if (!d) return sys_err("open directory " + dir);
    std::vector<std::string> names;
    while (struct dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    std::map<int, std::vector<int>> shards;   // n -> the i present
    int width = 5;
    std::vector<std::string> others;
    for (const std::string& n : names) {
        if (n.size() <= 12 || n.compare(n.size() - 12, 12, ".safetensors") != 0) continue;
        int i = 0, total = 0, used = 0;
        if (sscanf(n.c_str(), "model-%d-of-%d.safetensors%n", &i, &total, &used) == 2 && used == (int)n.size() && i >= 1 &&
            total >= 1 && i <= total) {
            shards[total].push_back(i);
            width = (int)(n.find("-of-") - 6);
        } else others.push_back(n);
    }
    if (shards.size() > 1)
        return dir + ": no model.safetensors.index.json, and shards of " + std::to_string(shards.size()) +
               " different splits (model-*-of-" + std::to_string(shards.begin()->first) + " and -of-" +
               std::to_string(shards.rbegin()->first) + "): which belong together is not clear";
    if (shards.size() == 1) {
        int total = shards.begin()->first;
        std::vector<int>& have = shards.begin()->second;
        for (int i = 1; i <= total; i++) {
            char b[96];
            snprintf(b, sizeof b, "model-%0*d-of-%0*d.safetensors", width, i, width, total);
            if (std::find(have.begin(), have.end(), i) == have.end())
                return dir + ": no model.safetensors.index.json, and shard " + b + " of the " + std::to_string(total) +
                       " is missing";
            files->push_back(b);
        }
        *how = "no model.safetensors.index.json: the " + std::to_string(total) + " shards model-*-of-" + files->back().substr(6 + width + 4);
        return "";
    }
    if (others.empty())
        return dir + ": no model.safetensors, no model.safetensors.index.json, and no other *.safetensors file";
    *files = others;
    *how = "no model.safetensors.index.json: every *.safetensors file of the directory (" + std::to_string(others.size()) + ")";
    return "";
}

// every tensor of an export directory: the files of model.safetensors.index.json when there is one,
// else model.safetensors, else the shards (or *.safetensors files) found in it (st_list_unindexed,
// *how says so; a tensor in two of them is refused)
static inline std::string st_read_dir(const std::string& dir, std::map<std::string, StTensor>* out, std::string* how = NULL) {
    std::string index = dir + "/model.safetensors.index.json";
    if (!path_exists(index) && path_exists(dir + "/model.safetensors")) return st_read_header(dir + "/model.safetensors", out);
    if (!path_exists(index)) {
        std::vector<std::string> files;
        std::string said, err = st_list_unindexed(dir, &files, &said);
        if (!err.empty()) return err;
        if (how) *how = said;
        for (const std::string& f : files) {
            std::map<std::string, StTensor> one;
            if (!(err = st_read_header(dir + "/" + f, &one)).empty()) return err;
            for (auto& t : one) {
                auto dup = out->find(t.first);
                if (dup != out->end()) return dir + ": tensor " + t.first + " is in both " + dup->second.file + " and " + t.second.file;
                (*out)[t.first] = t.second;
            }
        }
        return "";
    }
    std::string text, err = read_file(index, &text), perr;
    if (!err.empty()) return err;
    JsonValue j;
    if (!json_parse(text.data(), text.size(), &j, &perr)) return index + ": " + perr;
    const JsonValue* wm = json_get(&j, "weight_map");
    if (!wm || wm->kind != JsonValue::OBJ) return index + ": no weight_map";
    std::map<std::string, bool> files;
    for (const JsonValue& f : wm->items) files[f.text] = true;
    for (auto& f : files) if (!(err = st_read_header(dir + "/" + f.first, out)).empty()) return err;
    return "";
}

// (BF16 <-> float: f32_to_bf16, bf16_to_f32 in model/common.h)
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { int e = -1; do { e++; man <<= 1; } while (!(man & 0x400)); u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13); }
    } else if (exp == 31) u = sign | 0x7F800000u | (man << 13);
    else u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---------------------------------------------------------------------------------------------
// config.json

static inline std::string hf_config_json(const DbrxConfig* c, const char* dtype) {
    // off is null, as DbrxConfig reads it (a clip_qkv of 0 would clamp to 0; an absent
    // moe_normalize_expert_weights would be HF's default 1)
    std::string clip = dbrx_is_off(c->clip_qkv) ? "null" : json_float(c->clip_qkv);
    std::string norm = dbrx_is_off(c->moe_norm_p) ? "null" : json_float(c->moe_norm_p);
    char b[2048];
    snprintf(b, sizeof b,
             "{\n  \"architectures\": [\"DbrxForCausalLM\"],\n  \"model_type\": \"dbrx\",\n  \"d_model\": %d,\n  \"n_heads\": %d,\n"
             "  \"n_layers\": %d,\n  \"max_seq_len\": %d,\n  \"vocab_size\": %d,\n"
             "  \"attn_config\": {\"kv_n_heads\": %d, \"clip_qkv\": %s, \"rope_theta\": %s, \"attn_pdrop\": 0.0},\n"
             "  \"ffn_config\": {\"ffn_hidden_size\": %d, \"moe_num_experts\": %d, \"moe_top_k\": %d, \"moe_jitter_eps\": null, "
             "\"moe_loss_weight\": %s, \"moe_normalize_expert_weights\": %s, \"ffn_act_fn\": {\"name\": \"silu\"}},\n"
             "  \"tie_word_embeddings\": false,\n  \"initializer_range\": %s,\n  \"resid_pdrop\": 0.0,\n  \"emb_pdrop\": 0.0,\n"
             "  \"torch_dtype\": \"%s\",\n  \"use_cache\": true,\n"
             "  \"train_dbrx\": {\"ln_eps\": %s, \"z_loss_weight\": %s}\n}\n",
             c->d_model, c->n_heads, c->n_layers, c->max_seq_len, c->vocab_size, c->kv_heads, clip.c_str(),
             json_float(c->rope_theta).c_str(), c->ffn_hidden, c->n_experts, c->top_k, json_float(c->moe_loss_weight).c_str(),
             norm.c_str(), json_float(c->init_std).c_str(), dtype, json_float(c->ln_eps).c_str(), json_float(c->z_loss_weight).c_str());
    return b;
}

// "" if the settings of config.json are ones train_dbrx implements as the original DBRX code reads
// them, else the first that is not (bad input: the caller exits 2 naming the file):
//   attn_config.clip_qkv: null or absent (no clamp) or > 0. The original clamps to +-clip_qkv for any
//     number, so 0 would zero every q, k and v: refused rather than read as "off" (only null is off);
//   ffn_config.moe_normalize_expert_weights: a p >= 1 (the top-k weights divided by their p-norm), null
//     (not renormalised), or absent (DbrxFFNConfig's default, 1);
//   ffn_config.uniform_expert_assignment: true (MegaBlocks' benchmarking mode: experts assigned round
//     robin, the router ignored) is not implemented.
static inline std::string hf_config_check(const JsonValue* j) {
    const JsonValue* type = json_get(j, "model_type");
    if (type && !(type->kind == JsonValue::STR && type->text == "dbrx"))
        return "model_type " + json_show(type) + ": a DBRX checkpoint (\"dbrx\", DbrxForCausalLM) expected";
    const JsonValue* tie = json_get(j, "tie_word_embeddings");
    if (tie && !(tie->kind == JsonValue::NUL || (tie->kind == JsonValue::BOOL && !tie->b)))
        return "tie_word_embeddings " + json_show(tie) + ": DBRX's lm_head is a matrix of its own, not the embedding's (false or absent expected)";
    const JsonValue* attn = json_get(j, "attn_config");
    const JsonValue* ffn = json_get(j, "ffn_config");
    const JsonValue* clip = json_get(attn, "clip_qkv");
    double v;
    if (clip && clip->kind != JsonValue::NUL && !(json_double(clip, &v) && v > 0 && std::isfinite((float)v)))
        return "attn_config.clip_qkv " + json_show(clip) + " must be a positive number or null (no clamp): the original DBRX "
               "code clamps q, k and v to +-clip_qkv for every number, so 0 would zero them all";
    const JsonValue* norm = json_get(ffn, "moe_normalize_expert_weights");
    if (norm && norm->kind != JsonValue::NUL && !(json_double(norm, &v) && v >= 1 && std::isfinite((float)v)))
        return "ffn_config.moe_normalize_expert_weights " + json_show(norm) + " must be a number >= 1 (the p of the p-norm "
               "the top-k router weights are divided by; DBRX: 1) or null (no renormalisation)";
    const JsonValue* uni = json_get(ffn, "uniform_expert_assignment");
    if (uni && !(uni->kind == JsonValue::NUL || (uni->kind == JsonValue::BOOL && !uni->b)))
        return "ffn_config.uniform_expert_assignment " + json_show(uni) + ": train_dbrx routes every token by its router; "
               "the uniform (round-robin) expert assignment is not implemented (false or absent expected)";
    return "";
}

// "" if config.json describes the run's model, else the mismatched fields (HF defaults where it is silent:
// LayerNorm eps 1e-5 and no z-loss, as DbrxForCausalLM). Call hf_config_check first.
static inline std::string hf_config_mismatch(const JsonValue* j, const DbrxConfig* c) {
    const JsonValue* attn = json_get(j, "attn_config");
    const JsonValue* ffn = json_get(j, "ffn_config");
    const JsonValue* ours = json_get(j, "train_dbrx");
    struct { const char* name; const JsonValue* v; double run; double dflt; } f[] = {
        {"d_model", json_get(j, "d_model"), (double)c->d_model, NAN},
        {"n_heads", json_get(j, "n_heads"), (double)c->n_heads, NAN},
        {"n_layers", json_get(j, "n_layers"), (double)c->n_layers, NAN},
        {"max_seq_len", json_get(j, "max_seq_len"), (double)c->max_seq_len, NAN},
        {"vocab_size", json_get(j, "vocab_size"), (double)c->vocab_size, NAN},
        {"attn_config.kv_n_heads", json_get(attn, "kv_n_heads"), (double)c->kv_heads, NAN},
        {"attn_config.rope_theta", json_get(attn, "rope_theta"), (double)c->rope_theta, 10000},
        {"ffn_config.ffn_hidden_size", json_get(ffn, "ffn_hidden_size"), (double)c->ffn_hidden, NAN},
        {"ffn_config.moe_num_experts", json_get(ffn, "moe_num_experts"), (double)c->n_experts, NAN},
        {"ffn_config.moe_top_k", json_get(ffn, "moe_top_k"), (double)c->top_k, NAN},
        {"ffn_config.moe_loss_weight", json_get(ffn, "moe_loss_weight"), (double)c->moe_loss_weight, 0.01},
        {"ffn_config.moe_jitter_eps (train_dbrx has no jitter)", json_get(ffn, "moe_jitter_eps"), 0, 0},
        {"train_dbrx.ln_eps", json_get(ours, "ln_eps"), (double)c->ln_eps, 1e-5},
        {"train_dbrx.z_loss_weight", json_get(ours, "z_loss_weight"), (double)c->z_loss_weight, 0},
    };
    std::string out;
    for (auto& x : f) {
        double v = x.dflt;
        bool present = x.v && x.v->kind != JsonValue::NUL;
        if (present && !json_double(x.v, &v)) v = NAN;
        bool ok = !std::isnan(v) && (float)v == (float)x.run;
        if (!ok) {
            char b[200];
            snprintf(b, sizeof b, "%s%s %s (config.json) vs %g (this run)", out.empty() ? "" : ", ", x.name,
                     json_show(x.v).c_str(), x.run);
            out += b;
        }
    }
    // the optional settings: null is off; absent is DbrxConfig's default (clip_qkv: none; the
    // renormalisation: p = 1)
    struct { const char* name; const JsonValue* v; float run; float absent; } o[] = {
        {"attn_config.clip_qkv", json_get(attn, "clip_qkv"), c->clip_qkv, DBRX_OFF},
        {"ffn_config.moe_normalize_expert_weights", json_get(ffn, "moe_normalize_expert_weights"), c->moe_norm_p, 1.0f},
    };
    for (auto& x : o) {
        double v = 0;
        float hf = !x.v ? x.absent : x.v->kind == JsonValue::NUL ? DBRX_OFF : json_double(x.v, &v) ? (float)v : NAN;
        bool ok = dbrx_is_off(hf) ? dbrx_is_off(x.run) : hf == x.run;
        if (!ok) out += std::string(out.empty() ? "" : ", ") + x.name + " " +
                        (x.v ? json_show(x.v) : "absent (DbrxConfig's default: " + dbrx_setting_str(hf) + ")") +
                        " (config.json) vs " + dbrx_setting_str(x.run) + " (this run)";
    }
    const JsonValue* act = json_get(json_get(ffn, "ffn_act_fn"), "name");
    if (act && act->text != "silu") out += std::string(out.empty() ? "" : ", ") + "ffn_config.ffn_act_fn " + act->text + " (train_dbrx: silu)";
    return out;
}

// The model config.json describes (--generate takes its shape from there), read as hf_config_mismatch
// compares it (the same defaults where it is silent). Call hf_config_check first. "" or the first field
// that is missing or not a number.
static inline std::string hf_config_read(const JsonValue* j, DbrxConfig* c) {
    const JsonValue* attn = json_get(j, "attn_config");
    const JsonValue* ffn = json_get(j, "ffn_config");
    const JsonValue* ours = json_get(j, "train_dbrx");
    struct { const char* name; const JsonValue* v; int* out; } ints[] = {
        {"d_model", json_get(j, "d_model"), &c->d_model}, {"n_heads", json_get(j, "n_heads"), &c->n_heads},
        {"n_layers", json_get(j, "n_layers"), &c->n_layers}, {"max_seq_len", json_get(j, "max_seq_len"), &c->max_seq_len},
        {"vocab_size", json_get(j, "vocab_size"), &c->vocab_size}, {"attn_config.kv_n_heads", json_get(attn, "kv_n_heads"), &c->kv_heads},
        {"ffn_config.ffn_hidden_size", json_get(ffn, "ffn_hidden_size"), &c->ffn_hidden},
        {"ffn_config.moe_num_experts", json_get(ffn, "moe_num_experts"), &c->n_experts},
        {"ffn_config.moe_top_k", json_get(ffn, "moe_top_k"), &c->top_k}};
    for (auto& f : ints)
        if (!json_int(f.v, f.out)) return std::string(f.name) + " " + json_show(f.v);
    struct { const char* name; const JsonValue* v; float* out; double dflt; } floats[] = {
        {"attn_config.rope_theta", json_get(attn, "rope_theta"), &c->rope_theta, 10000},
        {"ffn_config.moe_loss_weight", json_get(ffn, "moe_loss_weight"), &c->moe_loss_weight, 0.01},
        {"train_dbrx.ln_eps", json_get(ours, "ln_eps"), &c->ln_eps, 1e-5},
        {"train_dbrx.z_loss_weight", json_get(ours, "z_loss_weight"), &c->z_loss_weight, 0},
        {"initializer_range", json_get(j, "initializer_range"), &c->init_std, 0.02}};
    for (auto& f : floats) {
        double v = f.dflt;
        if (f.v && f.v->kind != JsonValue::NUL && !json_double(f.v, &v)) return std::string(f.name) + " " + json_show(f.v);
        *f.out = (float)v;
    }
    double v = 0;
    const JsonValue* clip = json_get(attn, "clip_qkv");   // null or absent: off (checked > 0 otherwise)
    c->clip_qkv = clip && clip->kind != JsonValue::NUL && json_double(clip, &v) ? (float)v : DBRX_OFF;
    const JsonValue* norm = json_get(ffn, "moe_normalize_expert_weights");   // absent: 1; null: off
    c->moe_norm_p = !norm ? 1.0f : norm->kind == JsonValue::NUL ? DBRX_OFF : json_double(norm, &v) ? (float)v : NAN;
    c->head_dim = c->n_heads > 0 ? c->d_model / c->n_heads : 0;
    return "";
}

// ---------------------------------------------------------------------------------------------
// import

static inline std::string shape_str(const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); i++) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + "]";
}

// the table entry holding flat element e
static inline const ParamInfo* param_at(const std::vector<ParamInfo>& t, size_t e) {
    size_t lo = 0, hi = t.size();
    while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (t[mid].offset <= e) lo = mid; else hi = mid; }
    return &t[lo];
}

// Sets this rank's shard of the master weights from the export in dir (m, v = 0). Collective only in
// that every rank calls it; each reads its own bytes. Bad input (config, names, shapes, dtypes) exits 2.
static inline void hf_import(const std::string& dir, Zero* z, const DbrxConfig* cfg, const std::vector<ParamInfo>& table,
                             Comm* comm) {
    std::string text, err = read_file(dir + "/config.json", &text), perr;
    if (!err.empty()) fail(EXIT_BAD_INPUT, "--init-hf %s: %s", dir.c_str(), err.c_str());
    JsonValue j;
    if (!json_parse(text.data(), text.size(), &j, &perr)) fail(EXIT_BAD_INPUT, "--init-hf %s/config.json: %s", dir.c_str(), perr.c_str());
    std::string bad = hf_config_check(&j);
    if (!bad.empty()) fail(EXIT_BAD_INPUT, "--init-hf %s/config.json: %s", dir.c_str(), bad.c_str());
    std::string mism = hf_config_mismatch(&j, cfg);
    if (!mism.empty()) fail(EXIT_BAD_INPUT, "--init-hf %s/config.json does not match this run's model: %s", dir.c_str(), mism.c_str());
    std::map<std::string, StTensor> st;
    std::string how;
    if (!(err = st_read_dir(dir, &st, &how)).empty()) fail(EXIT_BAD_INPUT, "--init-hf %s", err.c_str());
    if (!how.empty() && comm->rank == 0) printf("note: --init-hf %s: %s\n", dir.c_str(), how.c_str());
    for (const ParamInfo& p : table) {
        auto it = st.find(p.name);
        if (it == st.end()) fail(EXIT_BAD_INPUT, "--init-hf %s: tensor %s is missing", dir.c_str(), p.name);
        const StTensor& t = it->second;
        std::vector<int64_t> want = {p.rows};
        if (p.cols) want.push_back(p.cols);
        if (t.shape != want) fail(EXIT_BAD_INPUT, "--init-hf %s: tensor %s has shape %s, the model needs %s", t.file.c_str(),
                                  p.name, shape_str(t.shape).c_str(), shape_str(want).c_str());
        if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
            fail(EXIT_BAD_INPUT, "--init-hf %s: tensor %s has dtype %s (F32, BF16 or F16 expected)", t.file.c_str(), p.name, t.dtype.c_str());
    }
    memset(z->master, 0, z->shard_total * sizeof(float));
    memset(z->m, 0, z->shard_total * sizeof(float));
    if (z->v) memset(z->v, 0, z->shard_total * sizeof(float));   // (LionW: none)
    std::map<std::string, int> fds;
    std::vector<char> buf;
    const size_t chunk_elems = (size_t)8 << 20;
    // progress (rank 0, its own pieces): a line every 10 s, so that a large import shows it is moving
    double t_start = now_seconds(), t_said = t_start, total = 0, read = 0;
    for (const ShardSegment& g : z->segs) total += (double)g.numel * st_dtype_bytes(st[param_at(table, g.flat_off)->name].dtype);
    for (const ShardSegment& g : z->segs) {   // this rank's pieces, tensor by tensor
        const ParamInfo* p = param_at(table, g.flat_off);
        const StTensor& t = st[p->name];
        if (!fds.count(t.file)) {
            int fd = open(t.file.c_str(), O_RDONLY);
            if (fd < 0) fail(EXIT_BAD_INPUT, "--init-hf: cannot open %s: %s", t.file.c_str(), strerror(errno));
            fds[t.file] = fd;
        }
        size_t es = st_dtype_bytes(t.dtype);
        for (size_t done = 0; done < g.numel; done += chunk_elems) {
            size_t n = std::min(chunk_elems, g.numel - done);
            uint64_t off = t.data_start + t.begin + (g.flat_off - p->offset + done) * es;
            buf.resize(n * es);
            err = pread_all(fds[t.file], buf.data(), n * es, off, t.file);
            if (!err.empty()) fail(EXIT_BAD_INPUT, "--init-hf: %s", err.c_str());
            real* dst = z->master + g.shard_off + done;
            if (t.dtype == "F32") memcpy(dst, buf.data(), n * 4);
            else {
                const uint16_t* h = (const uint16_t*)buf.data();
                for (size_t i = 0; i < n; i++) dst[i] = t.dtype == "BF16" ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
            }
            read += (double)n * es;
            if (comm->rank == 0 && now_seconds() - t_said >= 10) {
                t_said = now_seconds();
                printf("init: read %.2f of %.2f GB of this rank's shard (%.0f%%) in %.0f s\n", read / 1e9, total / 1e9, 100 * read / total,
                       t_said - t_start);
                fflush(stdout);
            }
        }
    }
    for (auto& f : fds) close(f.second);
    z->slot_unit[0] = z->slot_unit[1] = -1;
    int ok = 1;
    comm_all_reduce(&comm->world_group, &ok, 1, COMM_I32);   // everyone is done reading
}

// ---------------------------------------------------------------------------------------------
// export

typedef struct { std::string file; uint64_t begin, end; } StPlace;   // where a tensor goes

// the export layout: tensors in table order, a new file when one would pass max_file_bytes
static inline void hf_plan(const std::vector<ParamInfo>& table, size_t es, uint64_t max_file_bytes, std::vector<StPlace>* place,
                           std::vector<std::string>* files, std::vector<std::string>* headers) {
    std::vector<int> file_of(table.size());
    std::vector<uint64_t> sizes;
    int nf = 0;
    uint64_t cur = 0;
    for (size_t i = 0; i < table.size(); i++) {
        uint64_t b = table[i].numel * es;
        if (i == 0 || (cur > 0 && cur + b > max_file_bytes)) { nf++; cur = 0; }
        file_of[i] = nf - 1;
        place->push_back(StPlace{"", cur, cur + b});
        cur += b;
    }
    for (int f = 0; f < nf; f++) {
        char b[64];
        if (nf == 1) snprintf(b, sizeof b, "model.safetensors");
        else snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", f + 1, nf);
        files->push_back(b);
    }
    std::vector<std::string> hdr(nf, "{\"__metadata__\": {\"format\": \"pt\"}");
    const char* dt = es == 4 ? "F32" : "BF16";
    for (size_t i = 0; i < table.size(); i++) {
        const ParamInfo& p = table[i];
        (*place)[i].file = (*files)[file_of[i]];
        char b[320];
        if (p.cols) snprintf(b, sizeof b, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%d, %d], \"data_offsets\": [%llu, %llu]}", p.name, dt,
                             p.rows, p.cols, (unsigned long long)(*place)[i].begin, (unsigned long long)(*place)[i].end);
        else snprintf(b, sizeof b, ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%d], \"data_offsets\": [%llu, %llu]}", p.name, dt,
                      p.rows, (unsigned long long)(*place)[i].begin, (unsigned long long)(*place)[i].end);
        hdr[file_of[i]] += b;
    }
    for (std::string& h : hdr) { h += "}"; while ((8 + h.size()) % 8) h += " "; }
    *headers = hdr;
}

// Writes the export of the current weights to dir. dtype "bf16" or "fp32". Collective.
static inline void hf_export(const std::string& dir, Zero* z, const DbrxConfig* cfg, const std::vector<ParamInfo>& table,
                             const std::string& dtype, uint64_t max_file_bytes, Comm* comm) {
    size_t es = dtype == "fp32" ? 4 : 2;
    std::vector<StPlace> place;
    std::vector<std::string> files, headers;
    hf_plan(table, es, max_file_bytes, &place, &files, &headers);
    std::map<std::string, uint64_t> data_start;
    for (size_t f = 0; f < files.size(); f++) data_start[files[f]] = 8 + headers[f].size();
    std::string err;
    if (comm->rank == 0) {   // lay out the files aside: header written, full size allocated
        err = mkdir_p(dir);
        if (err.empty()) {   // an earlier export's files (possibly split differently) go first
            DIR* d = opendir(dir.c_str());
            while (d) {
                struct dirent* e = readdir(d);
                if (!e) break;
                std::string n = e->d_name;
                if (n.rfind("model", 0) == 0 && (n.find(".safetensors") != std::string::npos)) unlink((dir + "/" + n).c_str());
            }
            if (d) closedir(d);
        }
        for (size_t f = 0; f < files.size() && err.empty(); f++) {
            std::string tmp = dir + "/" + files[f] + ".tmp";
            int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0) { err = sys_err("create " + tmp); break; }
            uint64_t n = headers[f].size(), total = data_start[files[f]];
            for (size_t i = 0; i < table.size(); i++) if (place[i].file == files[f]) total = std::max(total, data_start[files[f]] + place[i].end);
            err = pwrite_all(fd, &n, 8, 0, tmp);
            if (err.empty()) err = pwrite_all(fd, headers[f].data(), n, 8, tmp);
            if (err.empty() && ftruncate(fd, (off_t)total) != 0) err = sys_err("allocate " + tmp);
            close(fd);
        }
    }
    int bad = err.empty() ? 0 : 1;
    comm_all_reduce(&comm->world_group, &bad, 1, COMM_I32);
    if (bad) { if (comm->rank == 0) fail(EXIT_RUNTIME, "--export-hf %s: %s", dir.c_str(), err.c_str()); exit(EXIT_RUNTIME); }
    // the first replica writes its pieces of every tensor where they belong (data parallel with EP: the EP
    // group's ranks, each its experts; the non-expert tensors, which each holds whole, the same bytes n times)
    if (zero_expert_replica(z)->rank == 0) {
        std::map<std::string, int> fds;
        std::vector<char> buf;
        const size_t chunk_elems = (size_t)8 << 20;
        for (const ShardSegment& g : z->segs) {
            size_t ti = (size_t)(param_at(table, g.flat_off) - table.data());
            const ParamInfo& p = table[ti];
            std::string path = dir + "/" + place[ti].file + ".tmp";
            if (!fds.count(path)) {
                int fd = open(path.c_str(), O_WRONLY);
                if (fd < 0) { err = sys_err("open " + path); break; }
                fds[path] = fd;
            }
            for (size_t done = 0; done < g.numel && err.empty(); done += chunk_elems) {
                size_t n = std::min(chunk_elems, g.numel - done);
                const real* src = z->master + g.shard_off + done;
                buf.resize(n * es);
                if (es == 4) memcpy(buf.data(), src, n * 4);
                else { uint16_t* h = (uint16_t*)buf.data(); for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]); }
                uint64_t off = data_start[place[ti].file] + place[ti].begin + (g.flat_off - p.offset + done) * es;
                err = pwrite_all(fds[path], buf.data(), n * es, off, path);
            }
            if (!err.empty()) break;
        }
        for (auto& f : fds) { if (fsync(f.second) != 0 && err.empty()) err = sys_err("fsync " + f.first); close(f.second); }
    }
    bad = err.empty() ? 0 : 1;
    if (bad) fprintf(stderr, "error: rank %d: --export-hf: %s\n", comm->rank, err.c_str());
    comm_all_reduce(&comm->world_group, &bad, 1, COMM_I32);
    if (bad) exit(EXIT_RUNTIME);
    if (comm->rank == 0) {   // publish: rename the files, then config.json and the index
        for (size_t f = 0; f < files.size() && err.empty(); f++) {
            std::string tmp = dir + "/" + files[f] + ".tmp", fin = dir + "/" + files[f];
            if (rename(tmp.c_str(), fin.c_str()) != 0) err = sys_err("rename " + tmp);
        }
        if (err.empty() && files.size() > 1) {
            uint64_t total = 0;
            for (const StPlace& p : place) total += p.end - p.begin;
            std::string idx = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total) + "},\n  \"weight_map\": {\n";
            for (size_t i = 0; i < table.size(); i++)
                idx += "    " + json_quote(table[i].name) + ": " + json_quote(place[i].file) + (i + 1 < table.size() ? ",\n" : "\n");
            idx += "  }\n}\n";
            err = write_file_atomic(dir + "/model.safetensors.index.json", idx);
        }
        if (err.empty()) err = write_file_atomic(dir + "/config.json", hf_config_json(cfg, es == 4 ? "float32" : "bfloat16"));
        if (err.empty()) err = fsync_path(dir);
    }
    bad = err.empty() ? 0 : 1;
    comm_all_reduce(&comm->world_group, &bad, 1, COMM_I32);
    if (bad) { if (comm->rank == 0) fail(EXIT_RUNTIME, "--export-hf %s: %s", dir.c_str(), err.c_str()); exit(EXIT_RUNTIME); }
}

// a small safetensors file from host buffers (one process): names, dtypes "F32"/"I32", shapes, data; meta: string
// pairs added to __metadata__ (safetensors allows only string values there)
typedef struct { std::string name, dtype; std::vector<int64_t> shape; const void* data; } StHostTensor;
static inline void st_write_host(const std::string& path, const std::vector<StHostTensor>& ts,
                                 const std::vector<std::pair<std::string, std::string>>& meta = {}) {
    std::string h = "{\"__metadata__\": {\"format\": \"pt\"";
    for (const auto& kv : meta) h += ", " + json_quote(kv.first) + ": " + json_quote(kv.second);
    h += "}";
    uint64_t off = 0;
    std::vector<uint64_t> bytes;
    for (const StHostTensor& t : ts) {
        uint64_t n = st_dtype_bytes(t.dtype);
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); i++) { n *= (uint64_t)t.shape[i]; shape += (i ? ", " : "") + std::to_string(t.shape[i]); }
        h += ", " + json_quote(t.name) + ": {\"dtype\": \"" + t.dtype + "\", \"shape\": [" + shape + "], \"data_offsets\": [" +
             std::to_string(off) + ", " + std::to_string(off + n) + "]}";
        off += n;
        bytes.push_back(n);
    }
    h += "}";
    while ((8 + h.size()) % 8) h += " ";
    std::string content(8, '\0');
    uint64_t hl = h.size();
    memcpy(&content[0], &hl, 8);
    content += h;
    for (size_t i = 0; i < ts.size(); i++) content.append((const char*)ts[i].data, bytes[i]);
    std::string err = write_file_atomic(path, content);
    if (!err.empty()) fail(EXIT_RUNTIME, "%s", err.c_str());
}
