/*
 * ckpt.h — sharded, atomic, verified checkpoints that resume exactly and load under another topology.
 *
 * A checkpoint is one directory per step, DIR/step_00000010/:
 *   shard_00000.bin ... shard_<S-1>.bin   one per shard rank of the first replica: a 64-byte header, then
 *                                         the rank's fp32 master weights, AdamW m and v, or LionW's m
 *                                         (--optimizer lion; each the shard layout of parallel/zero.h,
 *                                         padding included)
 *   manifest.json                         format version, model config, step, tokens seen, LR schedule
 *                                         position, optimizer, data loader state, RNG state, FP8 scaling
 *                                         state (checkpoint/fp8_state.h), topology, size and CRC-32C of
 *                                         every file, and its own CRC-32C
 *   gemm_plans_00000.txt ...              GPU builds: each rank's GEMM algorithms (model/matmul_pins.h),
 *                                         listed in the manifest's "gemm_plans" with size and CRC-32C
 * Atomic: everything is written into DIR/.tmp-step_00000010, fsynced, the directory renamed, then the
 * pointer DIR/latest replaced (written aside, fsynced, renamed). A crash or a full disk at any moment
 * leaves the previous checkpoint intact. Retention: the last --ckpt-keep plus every --ckpt-keep-every-th.
 * Asynchronous: the training loop blocks only while the shard is copied to host memory; a thread
 * writes it; ckpt_poll (every step) finds out when every writer is done and commits.
 * Verified: on load the manifest's own CRC and every file's size and CRC are checked; a bad checkpoint
 * is reported and the next older one tried (--resume auto); none valid is an error, none at all a fresh
 * start. Reshard: a rank reads, from the old files, the ranges its new shard needs (any old and new
 * shard group size); under HSDP the first replica reads and broadcasts to the others.
 * Everything here is collective: every rank calls the same functions at the same steps. This file: the
 * format, saving and the directory checks; ckpt_load.h (included at the end): loading and --resume.
 */
#pragma once
#include <signal.h>
#include <sys/statvfs.h>
#include <atomic>
#include <string>
#include <thread>
#include <vector>
#include "../model/dbrx.h"
#include "../parallel/comm.h"
#include "../parallel/zero.h"
#include "crc32c.h"
#include "files.h"
#include "fp8_state.h"
#include "json.h"
#include "../model/debug_hooks.h"
#include "../model/matmul_pins.h"

// the manifest's format: 2 added "fp8" (the FP8 scaling state); 3 the experts as units of their own,
// split in runs ("unit_runs", parallel/zero.h). 1 and 2 (each unit one run) are still read.
#define CKPT_FORMAT_VERSION 3
#define CKPT_FORMAT_VERSION_MIN 1
// the shard files' header (unchanged since version 1): a file holds a rank's shard in the layout the
// manifest describes (format 3: the pieces of the runs; 1 and 2: of whole units)
#define CKPT_SHARD_VERSION 1
#define CKPT_HEADER_BYTES 64
static const char CKPT_MAGIC[8] = {'D', 'B', 'R', 'X', 'C', 'K', 'P', 'T'};

// the run's place in training, saved and restored with the weights
typedef struct {
    int step = 0;               // optimizer steps completed
    int64_t tokens = 0;         // tokens trained on
    Rng rng = {0};              // the run's random stream (nothing stochastic draws from it yet; kept exact)
    std::string loader;         // the data loader's state, a JSON value (checkpoint/loader_state.h)
    std::string guard;          // the spike guard's statistics, a JSON value (checkpoint/spike_guard.h; "": none)
} TrainProgress;

// settings the manifest records for the reader (and that a resume warns about when they change)
typedef struct {
    int total_steps, warmup, seed, batch, seq, grad_accum;
    float lr, lr_floor;
    AdamWConfig opt;
} RunInfo;

typedef struct {
    std::string dir;
    int every = 0, keep = 3, keep_every = 0;
    int last_saved_step = -1;
    // the newest step known good: the run trained `confirm` steps past it with no step skipped by the spike
    // guard (or it was resumed from). Only checkpoints up to it count toward `keep`: the newer ones are
    // never deleted, so a divergence cannot remove the last good checkpoints.
    int confirmed_step = 0, confirm = 1;
    bool cleaned = false;
    bool weights_only = false;   // a load for --generate / --eval-only: the weights alone (ckpt_try_load)
    // the save in flight
    bool pending = false, writer = false;
    int step = -1;
    std::string name, tmp_dir, manifest_head;
    std::thread thread;
    std::atomic<int> done{0};
    std::string error;
    uint32_t crc = 0;
    uint64_t bytes = 0;
    uint32_t plans_crc = 0;       // this rank's GEMM plan table (gemm_plans_<rank>.txt; 0 bytes: none)
    uint64_t plans_bytes = 0;
    std::string plans_error;
    float* staging = NULL;
    size_t staging_n = 0;
    double blocked_s = 0, write_s = 0, t_start = 0;
} Checkpointer;

// what a finished save reports (rank 0)
typedef struct { bool ok; int step; double blocked_ms, write_ms, total_ms; uint64_t bytes; std::string path; } SaveReport;

static inline void ckpt_init(Checkpointer* ck, const std::string& dir, int every, int keep, int keep_every) {
    ck->dir = dir; ck->every = every; ck->keep = keep; ck->keep_every = keep_every;
    signal(SIGXFSZ, SIG_IGN);   // a file-size limit makes write() fail (EFBIG) like a full disk, not kill us
}

static inline std::string ckpt_step_name(int step) { char b[32]; snprintf(b, sizeof b, "step_%08d", step); return b; }
static inline std::string ckpt_shard_name(int s) { char b[32]; snprintf(b, sizeof b, "shard_%05d.bin", s); return b; }
static inline std::string ckpt_plans_name(int r) { char b[32]; snprintf(b, sizeof b, "gemm_plans_%05d.txt", r); return b; }

// ---------------------------------------------------------------------------------------------
// start-up: the directory can take checkpoints, and `latest` names the newest complete one

// (defined with the loading, in ckpt_load.h)
static inline std::string ckpt_read_manifest(const std::string& dir, std::string* text, JsonValue* man);

// rank 0: DIR/latest := name (written aside, fsynced, renamed) unless it names it already, with one log
// line saying what it named. "" or the error.
static inline std::string ckpt_point_latest(const std::string& dir, const std::string& name) {
    std::string path = dir + "/latest", cur;
    bool had = path_exists(path);
    if (had && !read_file(path, &cur).empty()) cur = "?";
    while (!cur.empty() && (cur.back() == '\n' || cur.back() == '\r' || cur.back() == ' ')) cur.pop_back();
    if (cur == name) return "";
    bool printable = cur.size() <= 64;
    for (char c : cur) printable = printable && c >= 0x20 && c < 0x7f;
    std::string err = write_file_atomic(path, name + "\n");
    if (err.empty()) {
        printf("ckpt: %s/latest %s%s%s; the newest complete checkpoint is %s: latest rewritten\n", dir.c_str(),
               had ? "named '" : "was missing", had ? (printable ? cur.c_str() : "(unreadable)") : "", had ? "'" : "", name.c_str());
        fflush(stdout);
    }
    return err;
}

// writes a 4 KiB file into dir, fsyncs it, removes it and fsyncs dir: "" or the reason it cannot
static inline std::string ckpt_probe_write(const std::string& dir) {
    std::string p = dir + "/.probe-" + std::to_string((long long)getpid());
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return "cannot write a test file (" + sys_err("create " + p) + ")";
    char block[4096];
    memset(block, 0, sizeof block);
    std::string err = write_all(fd, block, sizeof block, p);
    if (err.empty() && fsync(fd) != 0) err = sys_err("fsync " + p);
    if (close(fd) != 0 && err.empty()) err = sys_err("close " + p);
    if (unlink(p.c_str()) != 0 && err.empty()) err = sys_err("remove " + p);
    if (err.empty()) err = fsync_path(dir);
    return err.empty() ? "" : "cannot write a test file (" + err + ")";
}

// Before step 1 (collective; rank 0 looks, every rank learns the verdict): --ckpt-dir must be a
// directory (created if missing) in which a file can be written, fsynced and removed, and DIR/latest,
// if there, must be a file. Otherwise one line naming the directory and the reason, and every rank
// exits 2 — rather than train for hours and fail at the first save. Less free space than one
// checkpoint (the S shard files of this run's layout) is a warning naming both. Unless --resume auto
// (which points it at the checkpoint it loads), `latest` is pointed at the newest complete checkpoint
// (its manifest verifies): a kill between the rename of a step directory and the update of `latest`
// leaves `latest` one save behind.
static inline void ckpt_check_dir(Checkpointer* ck, const Zero* z, bool resume_auto, Comm* comm) {
    if (ck->dir.empty()) return;
    std::string err;
    if (comm->rank == 0) {
        const std::string& d = ck->dir;
        struct stat st;
        if (stat(d.c_str(), &st) == 0) { if (!S_ISDIR(st.st_mode)) err = "it exists and is not a directory"; }
        else if (errno != ENOENT && errno != ENOTDIR) err = sys_err("stat " + d);   // (those: mkdir says why)
        if (err.empty()) { std::string e = mkdir_p(d); if (!e.empty()) err = "cannot create it (" + e + ")"; }
        std::string latest = d + "/latest";
        if (err.empty() && stat(latest.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
            err = latest + " is " + (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                  " (it must be a file naming the newest checkpoint)";
        if (err.empty()) err = ckpt_probe_write(d);
        if (err.empty()) {
            uint64_t need = (uint64_t)z->P * (CKPT_HEADER_BYTES + (1ull + optimizer_moments()) * z->shard_total * sizeof(float));
            struct statvfs vf;
            if (statvfs(d.c_str(), &vf) != 0) fprintf(stderr, "warning: --ckpt-dir %s: %s: free space not checked\n", d.c_str(), strerror(errno));
            else if ((uint64_t)vf.f_bavail * vf.f_frsize < need)
                fprintf(stderr, "warning: --ckpt-dir %s: %llu bytes free, one checkpoint needs %llu bytes: saves will fail "
                        "unless space is freed\n", d.c_str(), (unsigned long long)vf.f_bavail * vf.f_frsize, (unsigned long long)need);
        }
        if (err.empty() && !resume_auto)
            for (auto& c : list_numbered_dirs(d, "step_")) {
                std::string text;
                JsonValue man;
                if (!ckpt_read_manifest(d + "/" + c.second, &text, &man).empty()) continue;
                std::string e = ckpt_point_latest(d, c.second);
                if (!e.empty()) err = "cannot repair latest (" + e + ")";
                break;
            }
    }
    int bad = err.empty() ? 0 : 1;
    comm_broadcast(&comm->world_group, &bad, sizeof bad, 0);
    if (bad) {
        comm_agreed_failure();   // every rank exits with the same verdict: none of them is a lost rank
        if (comm->rank == 0) fail(EXIT_BAD_INPUT, "--ckpt-dir %s: %s", ck->dir.c_str(), err.c_str());
        exit(EXIT_BAD_INPUT);
    }
}

// ---------------------------------------------------------------------------------------------
// the model config as JSON, and the comparison a resume makes

// The optional settings (clip_qkv, moe_normalize_expert_weights) are a number or null (off).
// the manifest's optimizer.kind: the state the shard files hold after the master weights (topology.arrays)
static inline const char* ckpt_optimizer_kind() { return g_optimizer_lion ? "lion" : "adamw"; }

static inline std::string ckpt_setting_json(float v) { return dbrx_is_off(v) ? "null" : json_float(v); }

static inline std::string ckpt_config_json(const DbrxConfig* c) {
    char b[1024];
    snprintf(b, sizeof b, "{\"d_model\": %d, \"n_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"n_layers\": %d, "
             "\"ffn_hidden\": %d, \"n_experts\": %d, \"top_k\": %d, \"vocab_size\": %d, \"max_seq_len\": %d, "
             "\"rope_theta\": %s, \"clip_qkv\": %s, \"moe_normalize_expert_weights\": %s, \"ln_eps\": %s, "
             "\"moe_loss_weight\": %s, \"z_loss_weight\": %s, \"init_std\": %s}", c->d_model, c->n_heads, c->kv_heads,
             c->head_dim, c->n_layers, c->ffn_hidden, c->n_experts, c->top_k, c->vocab_size, c->max_seq_len,
             json_float(c->rope_theta).c_str(), ckpt_setting_json(c->clip_qkv).c_str(), ckpt_setting_json(c->moe_norm_p).c_str(),
             json_float(c->ln_eps).c_str(), json_float(c->moe_loss_weight).c_str(), json_float(c->z_loss_weight).c_str(),
             json_float(c->init_std).c_str());
    return b;
}

// A saved optional setting: null is off (DBRX_OFF); a number is the value, except that a clip_qkv <= 0
// is off too (before off had its own representation, train_dbrx read --clip-qkv <= 0 as off and saved the
// number: such a checkpoint has no clamp); absent: `absent`. false: not a number or null.
static inline bool ckpt_saved_setting(const JsonValue* j, bool nonpositive_is_off, float absent, float* out) {
    double v;
    if (!j) { *out = absent; return true; }
    if (j->kind == JsonValue::NUL) { *out = DBRX_OFF; return true; }
    if (!json_double(j, &v)) return false;
    *out = nonpositive_is_off && v <= 0 ? DBRX_OFF : (float)v;
    return true;
}

// "" if the saved config (JSON object) matches, else the mismatched fields. init_std is not compared
// (it only shapes an initialisation the checkpoint replaces).
static inline std::string ckpt_config_mismatch(const JsonValue* saved, const DbrxConfig* c) {
    struct { const char* name; double run; } fields[] = {
        {"d_model", (double)c->d_model}, {"n_heads", (double)c->n_heads}, {"kv_heads", (double)c->kv_heads},
        {"head_dim", (double)c->head_dim}, {"n_layers", (double)c->n_layers}, {"ffn_hidden", (double)c->ffn_hidden},
        {"n_experts", (double)c->n_experts}, {"top_k", (double)c->top_k}, {"vocab_size", (double)c->vocab_size},
        {"max_seq_len", (double)c->max_seq_len}, {"rope_theta", (double)c->rope_theta},
        {"ln_eps", (double)c->ln_eps}, {"moe_loss_weight", (double)c->moe_loss_weight},
        {"z_loss_weight", (double)c->z_loss_weight}};
    std::string out;
    for (auto& f : fields) {
        double v;
        const JsonValue* j = json_get(saved, f.name);
        bool ok = json_double(j, &v) && (float)v == (float)f.run;
        if (!ok) {
            char b[160];
            snprintf(b, sizeof b, "%s%s %s (checkpoint) vs %g (this run)", out.empty() ? "" : ", ", f.name,
                     json_show(j).c_str(), f.run);
            out += b;
        }
    }
    // clip_qkv: absent is damage (every format has it); moe_normalize_expert_weights: absent in the
    // checkpoints written before the setting existed, which all renormalised by the sum (p = 1)
    struct { const char* name; float run; bool nonpositive_is_off; float absent; } opt[] = {
        {"clip_qkv", c->clip_qkv, true, NAN}, {"moe_normalize_expert_weights", c->moe_norm_p, false, 1.0f}};
    for (auto& f : opt) {
        const JsonValue* j = json_get(saved, f.name);
        float v = NAN;
        bool ok = ckpt_saved_setting(j, f.nonpositive_is_off, f.absent, &v) && !std::isnan(v) &&
                  (dbrx_is_off(v) ? dbrx_is_off(f.run) : v == f.run);
        if (!ok) {
            std::string saved_as = json_show(j);
            if (j && j->kind == JsonValue::NUM && dbrx_is_off(v)) saved_as += " (off)";   // a legacy clip_qkv <= 0
            out += std::string(out.empty() ? "" : ", ") + f.name + " " + saved_as + " (checkpoint) vs " + dbrx_setting_str(f.run) +
                   " (this run)";
        }
    }
    return out;
}

// The model a checkpoint holds, from its manifest's "model" (--generate takes its shape from there):
// "" or the first field that is missing or not a number.
static inline std::string ckpt_config_read(const JsonValue* saved, DbrxConfig* c) {
    struct { const char* name; int* v; } ints[] = {
        {"d_model", &c->d_model}, {"n_heads", &c->n_heads}, {"kv_heads", &c->kv_heads}, {"head_dim", &c->head_dim},
        {"n_layers", &c->n_layers}, {"ffn_hidden", &c->ffn_hidden}, {"n_experts", &c->n_experts}, {"top_k", &c->top_k},
        {"vocab_size", &c->vocab_size}, {"max_seq_len", &c->max_seq_len}};
    for (auto& f : ints)
        if (!json_int(json_get(saved, f.name), f.v)) return std::string("model.") + f.name + " " + json_show(json_get(saved, f.name));
    struct { const char* name; float* v; } floats[] = {
        {"rope_theta", &c->rope_theta}, {"ln_eps", &c->ln_eps}, {"moe_loss_weight", &c->moe_loss_weight},
        {"z_loss_weight", &c->z_loss_weight}, {"init_std", &c->init_std}};
    for (auto& f : floats) {
        double v;
        if (!json_double(json_get(saved, f.name), &v)) return std::string("model.") + f.name + " " + json_show(json_get(saved, f.name));
        *f.v = (float)v;
    }
    // (as ckpt_config_mismatch reads them: clip_qkv null or <= 0 is off; moe_normalize_expert_weights absent is 1)
    if (!ckpt_saved_setting(json_get(saved, "clip_qkv"), true, NAN, &c->clip_qkv) || std::isnan(c->clip_qkv))
        return "model.clip_qkv " + json_show(json_get(saved, "clip_qkv"));
    if (!ckpt_saved_setting(json_get(saved, "moe_normalize_expert_weights"), false, 1.0f, &c->moe_norm_p))
        return "model.moe_normalize_expert_weights " + json_show(json_get(saved, "moe_normalize_expert_weights"));
    return "";
}

// ---------------------------------------------------------------------------------------------
// saving

// the manifest without its "files" and its own checksum (rank 0 completes it at commit)
static inline std::string ckpt_manifest_head(const Zero* z, const DbrxConfig* cfg, const TrainProgress* prog,
                                             const RunInfo* run) {
    std::string units, runs;
    for (int u = 0; u < z->n_units; u++) {
        units += (u ? ", " : "") + std::to_string(z->unit_numel[u]);
        runs += u ? ", [" : "[";
        // a run: its size; under EP [flat offset, size, owner]; the GPU store's chunked experts (--zero-chunk-mib, not in
        // flat order) [flat offset, size, -1]
        for (size_t k = 0; k < z->runs[u].size(); k++) {
            const ShardRun& r = z->runs[u][k];
            runs += k ? ", " : "";
            if (r.owner < 0 && z->unit_nchunks[u] == 1) runs += std::to_string(r.numel);
            else runs += "[" + std::to_string(r.flat_off) + ", " + std::to_string(r.numel) + ", " + std::to_string(r.owner) + "]";
        }
        runs += "]";
    }
    char b[2048];
    snprintf(b, sizeof b,
             "{\n  \"format\": \"train_dbrx checkpoint\",\n  \"format_version\": %d,\n  \"step\": %d,\n  \"tokens_seen\": %lld,\n"
             "  \"lr_schedule\": {\"kind\": \"linear_warmup_%s\", \"position\": %d, \"total_steps\": %d, \"warmup_steps\": %d, "
             "\"lr\": %s, \"lr_floor\": %s, \"decay_frac\": %s},\n"
             "  \"optimizer\": {\"kind\": \"%s\", \"t\": %d, \"beta1\": %s, \"beta2\": %s, \"eps\": %s, "
             "\"weight_decay\": %s, \"grad_clip\": %s, \"moments\": \"%s\"},\n"
             "  \"rng\": {\"kind\": \"splitmix64\", \"seed\": %d, \"state\": %llu},\n",
             CKPT_FORMAT_VERSION, prog->step, (long long)prog->tokens, LR_SCHEDULE_NAMES[g_lr_schedule], prog->step, run->total_steps,
             run->warmup, json_float(run->lr).c_str(), json_float(run->lr_floor).c_str(),
             g_lr_schedule >= LR_WSD ? json_float((float)g_lr_decay_frac).c_str() : "null", ckpt_optimizer_kind(), prog->step, json_float(run->opt.beta1).c_str(),
             json_float(run->opt.beta2).c_str(), json_float(run->opt.eps).c_str(), json_float(run->opt.weight_decay).c_str(),
             json_float(run->opt.grad_clip).c_str(), g_adam_moments_bf16 ? "bf16" : "fp32", run->seed, (unsigned long long)prog->rng.state);
    std::string m = b;
    m += "  \"data_loader\": " + prog->loader + ",\n";
    if (!prog->guard.empty()) m += "  \"spike_guard\": " + prog->guard + ",\n";
    m += "  \"model\": " + ckpt_config_json(cfg) + ",\n";
    m += "  \"fp8\": " + ckpt_fp8_state_json(z->fp8_cfg, z->fp8_metas) + ",\n";
    snprintf(b, sizeof b, "  \"topology\": {\"world\": %d, \"shard_group_size\": %d, \"replicas\": %d, \"batch\": %d, "
             "\"seq\": %d, \"grad_accum\": %d, \"dtype\": \"float32\", \"arrays\": %s, "
             "\"header_bytes\": %d, \"expert_parallel\": %d, \"unit_numel\": [", z->W, z->P, z->W / z->P, run->batch, run->seq, run->grad_accum,
             g_optimizer_lion ? "[\"master\", \"lion_m\"]" : "[\"master\", \"adam_m\", \"adam_v\"]", CKPT_HEADER_BYTES, z->ep_n);
    m += b + units + "], \"unit_runs\": [" + runs + "]";
    if (z->ep_spread) m += ", \"ep_layout\": \"spread\"";   // (absent: packed) the owner runs' pieces by ep_layout_piece
    m += "},\n";
    return m;
}

static inline void ckpt_header(char* h, int shard_rank, int S, int n_units, size_t shard_total, int step) {
    memset(h, 0, CKPT_HEADER_BYTES);
    memcpy(h, CKPT_MAGIC, 8);
    uint32_t v[4] = {CKPT_SHARD_VERSION, (uint32_t)shard_rank, (uint32_t)S, (uint32_t)n_units};
    memcpy(h + 8, v, 16);
    uint64_t w[2] = {(uint64_t)shard_total, (uint64_t)step};
    memcpy(h + 24, w, 16);
}

// the writer thread: header + staging -> path, checksummed as it goes, fsynced
static inline void ckpt_write_thread(Checkpointer* ck, std::string path, int shard_rank, int S, int n_units, size_t shard_total,
                                     int step) {
    double t0 = now_seconds();
    char h[CKPT_HEADER_BYTES];
    ckpt_header(h, shard_rank, S, n_units, shard_total, step);
    std::string err;
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint32_t crc = 0;
    uint64_t bytes = 0;
    if (fd < 0) err = sys_err("create " + path);
    if (err.empty()) { err = write_all(fd, h, sizeof h, path); crc = crc32c_update(crc, h, sizeof h); bytes += sizeof h; }
    const size_t chunk = (size_t)16 << 20;
    size_t total = ck->staging_n * sizeof(float);
    const char* p = (const char*)ck->staging;
    for (size_t off = 0; err.empty() && off < total; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        crc = crc32c_update(crc, p + off, n);
        err = write_all(fd, p + off, n, path);
#ifdef __linux__
        // start the write-back of this chunk now: the disk works while we checksum the next one, and the
        // final fsync has little left to do (no burst of dirty pages at the end)
        if (err.empty()) sync_file_range(fd, (off_t)(CKPT_HEADER_BYTES + off), (off_t)n, SYNC_FILE_RANGE_WRITE);
#endif
        bytes += n;
        if (off + n >= total / 2 && off < total / 2) debug_ckpt_kill(step, "shard");
    }
    if (err.empty() && fsync(fd) != 0) err = sys_err("fsync " + path);
    if (fd >= 0 && close(fd) != 0 && err.empty()) err = sys_err("close " + path);
    ck->error = err;
    ck->crc = crc;
    ck->bytes = bytes;
    ck->write_s = now_seconds() - t0;
    ck->done.store(1);
}

// Starts the save of `prog->step` (collective). Blocks only to copy this rank's shard to host memory;
// the file is written by a thread. A save still in flight is finished first.
static inline SaveReport ckpt_wait_commit(Checkpointer* ck, Zero* z, Comm* comm);
static inline void ckpt_start_save(Checkpointer* ck, Zero* z, const DbrxConfig* cfg, const TrainProgress* prog,
                                   const RunInfo* run, Comm* comm, SaveReport* previous) {
    if (ck->pending) *previous = ckpt_wait_commit(ck, z, comm);
    ck->t_start = now_seconds();
    ck->step = prog->step;
    ck->name = ckpt_step_name(prog->step);
    ck->tmp_dir = ck->dir + "/.tmp-" + ck->name;
    // rank 0 clears what a crashed save may have left at this step, then every writer has the directory
    int ok = 1;
    if (comm->rank == 0) {
        std::string err = mkdir_p(ck->dir);
        if (err.empty() && !ck->cleaned) {   // what crashed saves and removals left behind
            for (auto& d : list_numbered_dirs(ck->dir, ".tmp-step_")) rm_rf(ck->dir + "/" + d.second);
            for (auto& d : list_numbered_dirs(ck->dir, ".trash-step_")) rm_rf(ck->dir + "/" + d.second);
            ck->cleaned = true;
        }
        if (err.empty()) err = rm_rf(ck->tmp_dir);
        if (err.empty()) err = mkdir_p(ck->tmp_dir);
        if (!err.empty()) { fprintf(stderr, "warning: checkpoint step %d not saved: %s\n", prog->step, err.c_str()); ok = 0; }
        ck->manifest_head = ckpt_manifest_head(z, cfg, prog, run);
    }
    comm_all_reduce(&comm->world_group, &ok, 1, COMM_I32);
    if (ok != comm->world) { ck->pending = false; return; }
    // every rank: its GEMM algorithms (a few KB, written here; none in the CPU build), so that a resume
    // reuses them (model/matmul_pins.h)
    std::string plans = matmul_pins_text();
    ck->plans_error.clear();
    ck->plans_bytes = plans.size();
    ck->plans_crc = crc32c_update(0, plans.data(), plans.size());
    if (!plans.empty()) ck->plans_error = write_file_atomic(ck->tmp_dir + "/" + ckpt_plans_name(comm->rank), plans);
    // the first replica writes: ranks 0..P-1 (layout groups are consecutive ranks; P = S but under data
    // parallelism with EP, where the files are those of ZeRO-3 over the EP group: zero_file_layout)
    ck->writer = zero_expert_replica(z)->rank == 0;
    ck->done.store(0);
    ck->error.clear();
    ck->pending = true;
    if (!ck->writer) return;
    Zero file;
    if (z->P != z->S) zero_file_layout(z, &file);
    const int n_arrays = 1 + optimizer_moments();   // master, then the optimizer's moments
    size_t total = z->P != z->S ? file.shard_total : z->shard_total, n = n_arrays * total;
    if (ck->staging_n != n) { free(ck->staging); ck->staging = (float*)mallocCheck(n * sizeof(float)); ck->staging_n = n; }
    double t0 = now_seconds();
    const float* arrays[3] = {z->master, z->m, z->v};
    for (int a = 0; a < n_arrays; a++)
        if (z->P != z->S) zero_copy_pieces(z, z->lrank, arrays[a], &file, z->lrank, ck->staging + a * total);
        else memcpy(ck->staging + a * total, arrays[a], total * sizeof(float));
    ck->blocked_s = now_seconds() - t0;
    ck->thread = std::thread(ckpt_write_thread, ck, ck->tmp_dir + "/" + ckpt_shard_name(z->lrank), z->lrank, z->P,
                             z->n_units, total, prog->step);
}

// Retention (rank 0): every checkpoint newer than the confirmed step (not yet known good), the newest
// `keep` of the others, and every keep_every-th step; the rest go aside, then away. Called at every
// commit and whenever the confirmed step moves on.
static inline void ckpt_retain(Checkpointer* ck) {
    std::vector<std::pair<long long, std::string>> all = list_numbered_dirs(ck->dir, "step_");   // newest first
    int confirmed_kept = 0;
    for (size_t i = 0; i < all.size(); i++) {
        bool unconfirmed = all[i].first > ck->confirmed_step;
        bool keep = unconfirmed || confirmed_kept < ck->keep || (ck->keep_every > 0 && all[i].first % ck->keep_every == 0) ||
                    all[i].second == ck->name;
        if (!unconfirmed && confirmed_kept < ck->keep) confirmed_kept++;
        if (keep) continue;
        std::string from = ck->dir + "/" + all[i].second, trash = ck->dir + "/.trash-" + all[i].second;
        if (rename(from.c_str(), trash.c_str()) == 0) rm_rf(trash);
    }
}

// After the spike guard stopped a run (rank 0): the checkpoints newer than the confirmed step go aside
// as suspect-step_* (kept for inspection; --resume auto no longer finds them) and `latest` points at the
// newest one left. Returns a line saying where a restart resumes.
static inline std::string ckpt_set_aside_unconfirmed(Checkpointer* ck) {
    std::string newest;
    for (auto& d : list_numbered_dirs(ck->dir, "step_")) {   // newest first
        if (d.first <= ck->confirmed_step) { if (newest.empty()) newest = d.second; continue; }
        std::string from = ck->dir + "/" + d.second, to = ck->dir + "/suspect-" + d.second;
        rm_rf(to);
        if (rename(from.c_str(), to.c_str()) != 0) fprintf(stderr, "warning: %s\n", sys_err("rename " + from).c_str());
        else fprintf(stderr, "guard: %s set aside as %s (saved after the newest checkpoint known good)\n", from.c_str(), to.c_str());
    }
    std::string err;
    if (newest.empty()) { unlink((ck->dir + "/latest").c_str()); return "no checkpoint known good is left in " + ck->dir; }
    if (!(err = write_file_atomic(ck->dir + "/latest", newest + "\n")).empty()) fprintf(stderr, "warning: %s\n", err.c_str());
    return "the newest checkpoint known good is " + ck->dir + "/" + newest + " (latest points at it)";
}

// rank 0: manifest, rename, latest, retention. Returns "" or the error.
// info: CKPT_POLL_WORDS per rank (ckpt_poll)
#define CKPT_POLL_WORDS 7
static inline std::string ckpt_commit(Checkpointer* ck, const Zero* z, const std::vector<int64_t>& info) {
    const int W = CKPT_POLL_WORDS;
    std::string m = ck->manifest_head + "  \"files\": [\n", plans;
    for (int s = 0; s < z->P; s++) {
        char b[256];
        snprintf(b, sizeof b, "    {\"name\": \"%s\", \"shard_rank\": %d, \"bytes\": %lld, \"crc32c\": \"%08x\"}%s\n",
                 ckpt_shard_name(s).c_str(), s, (long long)info[W * s + 3], (unsigned)info[W * s + 2], s + 1 < z->P ? "," : "");
        m += b;
    }
    for (size_t r = 0; r < info.size() / W; r++) {   // the ranks' GEMM plan tables (GPU builds)
        if (!info[W * r + 5]) continue;
        char b[256];
        snprintf(b, sizeof b, "%s    {\"name\": \"%s\", \"rank\": %zu, \"bytes\": %lld, \"crc32c\": \"%08x\"}", plans.empty() ? "" : ",\n",
                 ckpt_plans_name((int)r).c_str(), r, (long long)info[W * r + 5], (unsigned)info[W * r + 6]);
        plans += b;
    }
    m += "  ],\n";
    if (!plans.empty()) m += "  \"gemm_plans\": [\n" + plans + "\n  ],\n";
    m += "  \"manifest_crc32c\": \"00000000\"\n}\n";
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", crc32c_update(0, m.data(), m.size()));
    m.replace(m.rfind("00000000"), 8, crc);
    std::string path = ck->tmp_dir + "/manifest.json", err;
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return sys_err("create " + path);
    err = write_all(fd, m.data(), m.size(), path);
    if (err.empty() && fsync(fd) != 0) err = sys_err("fsync " + path);
    if (close(fd) != 0 && err.empty()) err = sys_err("close " + path);
    if (err.empty()) err = fsync_path(ck->tmp_dir);
    if (!err.empty()) return err;
    debug_ckpt_kill(ck->step, "manifest");
    // a directory for this step from an earlier, abandoned line of training goes aside first
    std::string final_dir = ck->dir + "/" + ck->name;
    if (path_exists(final_dir)) {
        std::string trash = ck->dir + "/.trash-" + ck->name;
        if (!(err = rm_rf(trash)).empty()) return err;
        if (rename(final_dir.c_str(), trash.c_str()) != 0) return sys_err("rename " + final_dir);
    }
    if (rename(ck->tmp_dir.c_str(), final_dir.c_str()) != 0) return sys_err("rename " + ck->tmp_dir);
    if (!(err = fsync_path(ck->dir)).empty()) return err;
    debug_ckpt_kill(ck->step, "rename");
    if (!(err = write_file_atomic(ck->dir + "/latest", ck->name + "\n")).empty()) return err;
    ckpt_retain(ck);
    rm_rf(ck->dir + "/.trash-" + ck->name);
    return "";
}

// every rank: is the save in flight written everywhere? If so, commit it. Collective (an all-gather of
// 40 bytes per rank) while a save is in flight; nothing otherwise. wait: block until it is written.
static inline SaveReport ckpt_poll(Checkpointer* ck, Zero* z, Comm* comm, bool wait) {
    SaveReport rep = {false, -1, 0, 0, 0, 0, ""};
    if (!ck->pending) return rep;
    if (wait && ck->writer && ck->thread.joinable()) ck->thread.join();
    const int W = CKPT_POLL_WORDS;
    bool done = !ck->writer || ck->done.load();
    int64_t mine[CKPT_POLL_WORDS] = {done ? 1 : 0, (done && !ck->error.empty()) || !ck->plans_error.empty() ? 1 : 0, ck->crc,
                                     (int64_t)ck->bytes, (int64_t)(ck->write_s * 1e6), (int64_t)ck->plans_bytes, ck->plans_crc};
    std::vector<int64_t> all((size_t)W * comm->world);
    comm_all_gather(&comm->world_group, mine, all.data(), W * sizeof(int64_t), COMM_BYTE);
    for (int r = 0; r < comm->world; r++) if (!all[W * r]) return rep;   // not yet: ask again next step
    if (ck->writer && ck->thread.joinable()) ck->thread.join();
    if (ck->writer && !ck->error.empty()) fprintf(stderr, "warning: rank %d: checkpoint step %d: %s\n", comm->rank, ck->step, ck->error.c_str());
    if (!ck->plans_error.empty()) fprintf(stderr, "warning: rank %d: checkpoint step %d: %s\n", comm->rank, ck->step, ck->plans_error.c_str());
    rep.step = ck->step;
    rep.blocked_ms = ck->blocked_s * 1e3;
    rep.path = ck->dir + "/" + ck->name;
    int failed = 0;
    for (int r = 0; r < comm->world; r++) {
        failed += all[W * r + 1] ? 1 : 0;
        rep.bytes += (uint64_t)all[W * r + 3] + (uint64_t)all[W * r + 5];
        if (all[W * r + 4] / 1e3 > rep.write_ms) rep.write_ms = all[W * r + 4] / 1e3;
    }
    std::string err;
    if (comm->rank == 0) {
        if (failed) err = std::to_string(failed) + " rank(s) could not write their files";
        else err = ckpt_commit(ck, z, all);
        if (!err.empty()) {
            fprintf(stderr, "warning: checkpoint step %d failed (%s); the previous checkpoint is kept\n", ck->step, err.c_str());
            rm_rf(ck->tmp_dir);
        }
    }
    int ok = err.empty() ? 1 : 0;
    comm_broadcast(&comm->world_group, &ok, sizeof ok, 0);
    rep.ok = ok;
    rep.total_ms = (now_seconds() - ck->t_start) * 1e3;
    if (ok) ck->last_saved_step = ck->step;
    ck->pending = false;
    return rep;
}
static inline SaveReport ckpt_wait_commit(Checkpointer* ck, Zero* z, Comm* comm) { return ckpt_poll(ck, z, comm, true); }

static inline void ckpt_free(Checkpointer* ck) {
    if (ck->thread.joinable()) ck->thread.join();
    free(ck->staging);
    ck->staging = NULL;
    ck->staging_n = 0;
}

// the loading half (manifest check, verified load, reshard, resume) lives in ckpt_load.h; every file that
// includes this one gets it too
#include "ckpt_load.h"
