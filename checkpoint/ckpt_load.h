/*
 * ckpt_load.h — loading a checkpoint (the format and the saving half: checkpoint/ckpt.h): the manifest's
 * own check, the old layout read from the manifest, every file's size and CRC verified while this rank's
 * pieces of the new layout are copied out of the old shard files (any old and new shard group size), the
 * run's place restored, and --resume's choice of checkpoint (the newest valid one, older ones after a
 * damaged one). Everything here is collective: every rank calls the same functions and makes the same
 * collective calls in the same order.
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "ckpt.h"

// ---------------------------------------------------------------------------------------------
// loading

// Reads and checks DIR/manifest.json: its own CRC, the format. Returns "" or what is wrong.
static inline std::string ckpt_read_manifest(const std::string& dir, std::string* text, JsonValue* man) {
    std::string path = dir + "/manifest.json";
    if (!path_exists(path)) return "missing manifest.json";
    std::string err = read_file(path, text);
    if (!err.empty()) return err;
    size_t at = text->rfind("\"manifest_crc32c\": \"");
    if (at == std::string::npos || at + 28 > text->size()) return "manifest.json has no manifest_crc32c";
    std::string saved = text->substr(at + 20, 8), zeroed = *text;
    zeroed.replace(at + 20, 8, "00000000");
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", crc32c_update(0, zeroed.data(), zeroed.size()));
    if (saved != crc) return "manifest.json checksum mismatch (stored " + saved + ", computed " + crc + ")";
    std::string perr;
    if (!json_parse(text->data(), text->size(), man, &perr)) return "manifest.json: " + perr;
    int version = 0;
    if (!json_int(json_get(man, "format_version"), &version) || version < CKPT_FORMAT_VERSION_MIN || version > CKPT_FORMAT_VERSION)
        return "manifest.json: format_version is not one this program reads (" + std::to_string(CKPT_FORMAT_VERSION_MIN) + " to " +
               std::to_string(CKPT_FORMAT_VERSION) + ")";
    return "";
}

// one copy of a range of an old shard file into this rank's new shard
typedef struct { uint64_t file_off, bytes; float* dst; } CopySeg;

// The old layout, from the manifest alone: format 3 lists every unit's runs, 1 and 2 the units' sizes
// (each unit one run). Any layout of the same parameters loads into any other. Sets the old shard group
// size, the format version, the old expert parallelism and every unit's runs; returns "" or what is wrong
// (parameters other than the model's included).
static inline std::string ckpt_old_layout(const JsonValue* man, const Zero* z, int* S_old_out, int* version_out, int* ep_old_out,
                                          std::vector<std::vector<RunSpec>>* runs_out) {
    const JsonValue* topo = json_get(man, "topology");
    const JsonValue* files = json_get(man, "files");
    int& S_old = *S_old_out;
    S_old = 0;
    std::string fmt_err;
    if (!json_int(json_get(topo, "shard_group_size"), &S_old) || S_old <= 0 || !files || files->kind != JsonValue::ARR ||
        (int)files->items.size() != S_old)
        fmt_err = "manifest.json: topology and files disagree";
    int& version = *version_out;
    version = 0;
    json_int(json_get(man, "format_version"), &version);
    std::vector<std::vector<RunSpec>>& runs_old = *runs_out;
    runs_old.clear();
    int& ep_old = *ep_old_out;
    ep_old = 1;   // expert parallelism: a run [flat offset, size, owner] belongs to one EP rank (absent: 1)
    const JsonValue* epv = json_get(topo, "expert_parallel");
    if (epv && (!json_int(epv, &ep_old) || ep_old < 1 || S_old % ep_old)) fmt_err = "manifest.json: expert_parallel";
    const JsonValue* ul = json_get(topo, version >= 3 ? "unit_runs" : "unit_numel");
    if (fmt_err.empty() && (!ul || ul->kind != JsonValue::ARR || ul->items.empty())) fmt_err = "manifest.json: unit_runs / unit_numel";
    size_t params_old = 0, params = 0, flat = 0;
    for (size_t u = 0; fmt_err.empty() && u < ul->items.size(); u++) {
        const JsonValue* it = &ul->items[u];
        runs_old.emplace_back();
        if (version < 3) it = NULL;   // a unit's size: one run
        size_t n_runs = it ? (it->kind == JsonValue::ARR ? it->items.size() : 0) : 1;
        if (n_runs == 0) fmt_err = "manifest.json: unit_runs[" + std::to_string(u) + "]";
        size_t unit_end = flat;
        for (size_t k = 0; fmt_err.empty() && k < n_runs; k++) {
            const JsonValue* e = it ? &it->items[k] : &ul->items[u];
            uint64_t n = 0, off = flat;
            int owner = -1;
            bool ok = e->kind == JsonValue::ARR ? (e->items.size() == 3 && json_u64(&e->items[0], &off) && json_u64(&e->items[1], &n) &&
                                                   json_int(&e->items[2], &owner) && owner >= -1 && owner < ep_old)
                                                : json_u64(e, &n);
            if (!ok || n == 0) { fmt_err = "manifest.json: unit sizes"; break; }
            runs_old.back().push_back(RunSpec{(size_t)off, (size_t)n, owner});
            params_old += n;
            if (e->kind != JsonValue::ARR) flat += n;   // (a run with its offset: EP, or the GPU store's chunked experts)
            unit_end = std::max(unit_end, (size_t)(off + n));
        }
        flat = std::max(flat, unit_end);   // (an EP unit's runs are not in flat order: the unit ends at its last element)
    }
    for (int u = 0; u < z->n_units; u++) params += z->unit_numel[u];
    if (fmt_err.empty() && params_old != params)
        fmt_err = "manifest.json: the units hold " + std::to_string(params_old) + " parameters, the model " + std::to_string(params);
    return fmt_err;
}

// the old shard files as the manifest's "files" lists them: name, size, CRC-32C
typedef struct {
    std::vector<std::string> names;
    std::vector<uint64_t> bytes;
    std::vector<uint32_t> crc;
} CkptFileTable;

// Reads the manifest's S_old files (ckpt_old_layout checked there are that many): each must be shard f
// of expect_bytes bytes. "" or the entry that is not.
static inline std::string ckpt_read_file_table(const JsonValue* man, int S_old, uint64_t expect_bytes, CkptFileTable* t) {
    const JsonValue* files = json_get(man, "files");
    t->names.resize(S_old);
    t->bytes.resize(S_old);
    t->crc.resize(S_old);
    for (int f = 0; f < S_old; f++) {
        const JsonValue* e = &files->items[f];
        uint64_t bytes, crc;
        const JsonValue* nm = json_get(e, "name");
        const JsonValue* cv = json_get(e, "crc32c");
        if (!nm || !json_u64(json_get(e, "bytes"), &bytes) || !cv || cv->text.size() != 8) return "manifest.json: files[" + std::to_string(f) + "]";
        crc = strtoull(cv->text.c_str(), NULL, 16);
        t->names[f] = nm->text; t->bytes[f] = bytes; t->crc[f] = (uint32_t)crc;
        if (bytes != expect_bytes || nm->text != ckpt_shard_name(f)) return "manifest.json: files[" + std::to_string(f) + "] is not the expected shard";
    }
    return "";
}

// rank 0 checks every file's presence and size (cheap; the readers check the contents): marks the bad
// ones in file_bad, *local_err the last one's reason
static inline void ckpt_stat_files(const std::string& dir, const CkptFileTable* t, int S_old, std::vector<int>* file_bad,
                                   std::string* local_err) {
    for (int f = 0; f < S_old; f++) {
        struct stat st;
        std::string p = dir + "/" + t->names[f];
        if (stat(p.c_str(), &st) != 0) { (*file_bad)[f] = 1; *local_err = p + ": missing"; }
        else if ((uint64_t)st.st_size != t->bytes[f]) {
            (*file_bad)[f] = 1;
            *local_err = p + ": " + std::to_string(st.st_size) + " bytes, the manifest says " + std::to_string(t->bytes[f]) + " (truncated?)";
        }
    }
}

// a piece of a rank's shard in a layout: (flat lo, flat hi, place in its shard buffers)
typedef struct { size_t lo, hi, at; } CkptPiece;

// rank r's pieces of layout L, in flat order
static inline std::vector<CkptPiece> ckpt_pieces_of(const Zero* L, int r) {
    std::vector<CkptPiece> p;
    for (int u = 0; u < L->n_units; u++)
        zero_unit_pieces(L, u, r, [&](size_t lo, size_t hi, size_t at) { if (lo < hi) p.push_back(CkptPiece{lo, hi, L->shard_off[u] + at}); });
    std::sort(p.begin(), p.end(), [](const CkptPiece& a, const CkptPiece& b) { return a.lo < b.lo; });
    return p;
}

// The copies that take this rank's pieces (mine) out of an old file whose pieces are `theirs`: every
// overlap, for each of the n_arrays arrays (master, then the optimizer's m, v or m: total_old floats each in the file), in
// file order
static inline std::vector<CopySeg> ckpt_copy_segs(const std::vector<CkptPiece>& theirs, const std::vector<CkptPiece>& mine,
                                                  float* const arrays[3], int n_arrays, size_t total_old) {
    std::vector<CopySeg> segs;
    for (size_t i = 0, j = 0; i < theirs.size() && j < mine.size();) {   // the overlaps of two sorted, disjoint lists
        const CkptPiece &o = theirs[i], &n = mine[j];
        size_t lo = std::max(o.lo, n.lo), hi = std::min(o.hi, n.hi);
        if (lo < hi)
            for (int a = 0; a < n_arrays; a++)
                segs.push_back(CopySeg{CKPT_HEADER_BYTES + 4ull * (a * total_old + o.at + (lo - o.lo)), 4ull * (hi - lo),
                                       arrays[a] + n.at + (lo - n.lo)});
        if (o.hi <= n.hi) i++; else j++;
    }
    std::sort(segs.begin(), segs.end(), [](const CopySeg& a, const CopySeg& b) { return a.file_off < b.file_off; });
    return segs;
}

// Streams old shard file f (of S_old, in layout `old`) once: checksums all of it, checks its header and
// its length against the manifest, and copies out the segments (sorted, disjoint). Rank 0 says how a
// large load goes every 10 s (t_start: when the load began; *t_said: when it last said). "" or what is
// wrong with the file.
static inline std::string ckpt_read_old_shard(const std::string& dir, int f, const CkptFileTable* t, const Zero* old, int S_old,
                                              const std::vector<CopySeg>& segs, int rank, double t_start, double* t_said) {
    std::string p = dir + "/" + t->names[f];
    int fd = open(p.c_str(), O_RDONLY);
    if (fd < 0) return p + ": missing (" + strerror(errno) + ")";
    const size_t chunk = (size_t)16 << 20;
    std::vector<char> buf(chunk);
    uint32_t crc = 0;
    size_t next = 0;
    std::string err;
    for (uint64_t off = 0; err.empty() && off < t->bytes[f]; off += chunk) {
        size_t n = (size_t)std::min<uint64_t>(chunk, t->bytes[f] - off);
        if (rank == 0 && now_seconds() - *t_said >= 10) {   // progress of a large load, every 10 s (rank 0's files)
            *t_said = now_seconds();
            printf("resume: reading %s: %s %.2f of %.2f GB (%.0f%%), %.0f s\n", dir.c_str(), t->names[f].c_str(), off / 1e9,
                   t->bytes[f] / 1e9, 100.0 * off / t->bytes[f], *t_said - t_start);
            fflush(stdout);
        }
        err = pread_all(fd, buf.data(), n, off, p);
        if (!err.empty()) break;
        if (off == 0) {
            char h[CKPT_HEADER_BYTES];
            ckpt_header(h, f, S_old, old->n_units, old->shard_total, 0);
            if (n < CKPT_HEADER_BYTES || memcmp(buf.data(), h, 24) != 0 || memcmp(buf.data() + 24, h + 24, 8) != 0)
                err = p + ": bad header (not shard " + std::to_string(f) + " of " + std::to_string(S_old) + ")";
        }
        crc = crc32c_update(crc, buf.data(), n);
        // copy every piece's part that lies in [off, off + n); pieces are sorted and disjoint
        for (size_t i = next; i < segs.size() && segs[i].file_off < off + n; i++) {
            const CopySeg& g = segs[i];
            uint64_t a = std::max<uint64_t>(g.file_off, off), e = std::min<uint64_t>(g.file_off + g.bytes, off + n);
            if (a < e) memcpy((char*)g.dst + (a - g.file_off), buf.data() + (a - off), e - a);
            if (g.file_off + g.bytes <= off + n) next = i + 1;
        }
    }
    // the file's true length must also match (a longer file is not the one the manifest describes)
    struct stat st;
    if (err.empty() && (fstat(fd, &st) != 0 || (uint64_t)st.st_size != t->bytes[f]))
        err = p + ": size differs from the manifest";
    close(fd);
    if (err.empty() && crc != t->crc[f]) {
        char b[64];
        snprintf(b, sizeof b, "%08x, the manifest says %08x", crc, t->crc[f]);
        err = p + ": checksum mismatch (computed " + b + ")";
    }
    return err;
}

// The run's place, from the manifest: step, tokens seen, RNG, data loader and spike guard into prog,
// the FP8 scaling state (format_version 2 on; before it there is none) into z's FP8 state, its verdict
// in *fp8_err (malformed = damaged; the ranks agree on it) and what rank 0 says about it in *notes.
// "" or what the manifest lacks.
static inline std::string ckpt_restore_place(const JsonValue* man, const std::string& text, int version, Zero* z,
                                             TrainProgress* prog, std::string* fp8_err, std::string* notes) {
    int64_t tokens = 0;
    uint64_t rng = 0;
    const JsonValue* loader = json_get(man, "data_loader");
    if (!json_int(json_get(man, "step"), &prog->step) || !json_i64(json_get(man, "tokens_seen"), &tokens) ||
        !json_u64(json_get(json_get(man, "rng"), "state"), &rng) || !loader)
        return "manifest.json: step, tokens_seen, rng or data_loader missing";
    prog->tokens = tokens;
    prog->rng.state = rng;
    prog->loader = text.substr(loader->begin, loader->end - loader->begin);
    const JsonValue* guard = json_get(man, "spike_guard");   // (absent before the guard existed)
    prog->guard = guard ? text.substr(guard->begin, guard->end - guard->begin) : "";
    const JsonValue* fp8 = json_get(man, "fp8");
    if (version >= 2 && !fp8) return "manifest.json: fp8 missing";
    *fp8_err = ckpt_fp8_state_restore(z->fp8_cfg, z->fp8_metas, fp8, notes);
    return "";
}

// Reads checkpoint `dir` into z (this rank's shard of master, m, v) and prog. Returns "" or what is
// wrong with it (the same on every rank). cfg mismatch is an error exit (not a reason to fall back).
// weights_only (--generate, --eval-only): the master weights alone, whatever optimizer saved them.
static inline std::string ckpt_try_load(const std::string& dir, Zero* z, const DbrxConfig* cfg, TrainProgress* prog,
                                        JsonValue* man_out, Comm* comm, bool weights_only = false) {
    std::string text, why = ckpt_read_manifest(dir, &text, man_out);
    const JsonValue* man = man_out;
    // every rank read the same manifest; agree anyway (a rank may see a different file system state)
    int bad = why.empty() ? 0 : 1;
    comm_all_reduce(&comm->world_group, &bad, 1, COMM_I32);
    if (bad) return why.empty() ? "manifest unreadable on another rank" : why;
    std::string mism = ckpt_config_mismatch(json_get(man, "model"), cfg);
    if (!mism.empty()) {
        if (comm->rank == 0) fail(EXIT_BAD_INPUT, "checkpoint %s does not match this run's model: %s", dir.c_str(), mism.c_str());
        exit(EXIT_BAD_INPUT);
    }
    // the optimizer's state (absent before --optimizer: AdamW's): another optimizer's moments are not this one's
    const JsonValue* kind = json_get(json_get(man, "optimizer"), "kind");
    std::string kind_old = kind && kind->kind == JsonValue::STR ? kind->text : "adamw";
    if (kind_old != "adamw" && kind_old != "lion") return "manifest.json: optimizer.kind '" + kind_old + "'";
    if (kind_old != ckpt_optimizer_kind() && !weights_only) {
        if (comm->rank == 0)
            fail(EXIT_BAD_INPUT, "checkpoint %s holds %s's state: --optimizer %s cannot continue it (resume with --optimizer %s, or "
                 "start from its weights: --export-hf, then --init-hf)", dir.c_str(), kind_old.c_str(), ckpt_optimizer_kind(),
                 kind_old.c_str());
        exit(EXIT_BAD_INPUT);
    }
    const int n_file = kind_old == "lion" ? 2 : 3;       // the arrays a file holds (topology.arrays)
    const int n_arrays = weights_only ? 1 : n_file;       // the ones read: the same optimizer's, or the weights
    int S_old = 0, version = 0, ep_old = 1;
    std::vector<std::vector<RunSpec>> runs_old;
    std::string fmt_err = ckpt_old_layout(man, z, &S_old, &version, &ep_old, &runs_old);
    if (!fmt_err.empty()) return fmt_err;
    // --ep-layout of the writer (absent: packed): which old file holds which piece of an EP rank's runs
    const JsonValue* lay = json_get(json_get(man, "topology"), "ep_layout");
    int spread_old = lay && lay->kind == JsonValue::STR && lay->text == "spread";
    if (lay && !spread_old && !(lay->kind == JsonValue::STR && lay->text == "packed")) return "manifest.json: topology.ep_layout";
    if (spread_old && (ep_old < 2 || S_old <= ep_old)) return "manifest.json: topology.ep_layout spread with expert_parallel " + std::to_string(ep_old);
    Zero old;
    zero_layout_from_runs(&old, runs_old, S_old, ep_old, spread_old);
    size_t total_old = old.shard_total;
    uint64_t expect_bytes = CKPT_HEADER_BYTES + (uint64_t)n_file * total_old * sizeof(float);
    std::vector<int> file_bad(S_old + 1, 0);
    CkptFileTable table;
    std::string table_err = ckpt_read_file_table(man, S_old, expect_bytes, &table);
    if (!table_err.empty()) return table_err;
    std::string local_err;
    if (comm->rank == 0) ckpt_stat_files(dir, &table, S_old, &file_bad, &local_err);
    std::vector<CkptPiece> mine = ckpt_pieces_of(z, z->lrank);   // this rank's pieces of the new layout
    double t_start = now_seconds(), t_said = t_start;
    // the first replica reads: for each old file, the pieces of this rank's new shard it holds
    memset(z->master, 0, z->shard_total * sizeof(float));
    memset(z->m, 0, z->shard_total * sizeof(float));
    if (z->v) memset(z->v, 0, z->shard_total * sizeof(float));
    bool reader = zero_expert_replica(z)->rank == 0;   // (the replica group, but under data parallelism with EP)
    float* arrays[3] = {z->master, z->m, z->v};
    for (int f = 0; reader && f < S_old && local_err.empty(); f++) {
        std::vector<CopySeg> segs = ckpt_copy_segs(ckpt_pieces_of(&old, f), mine, arrays, n_arrays, total_old);
        if (segs.empty()) continue;
        // stream the whole file once: checksum everything, keep the pieces
        std::string err = ckpt_read_old_shard(dir, f, &table, &old, S_old, segs, comm->rank, t_start, &t_said);
        if (!err.empty()) { file_bad[f] = 1; local_err = err; }
    }
    if (!local_err.empty()) fprintf(stderr, "warning: rank %d: %s\n", comm->rank, local_err.c_str());
    comm_all_reduce(&comm->world_group, file_bad.data(), file_bad.size(), COMM_I32);
    std::string bad_files;
    for (int f = 0; f < S_old; f++) if (file_bad[f]) bad_files += (bad_files.empty() ? "" : ", ") + table.names[f];
    if (!bad_files.empty()) return "bad or missing " + bad_files;
    // a checkpoint holding a non-finite weight or moment is damage too, whatever its checksums say (this
    // program never writes one: the training loop checks before it saves)
    int nonfinite = 0;
    if (reader)
        for (int k = 0; k < n_arrays; k++) {
            const float* a = arrays[k];
            size_t bad = 0;
            #pragma omp parallel for reduction(+ : bad)
            for (size_t i = 0; i < z->shard_total; i++) bad += !std::isfinite(a[i]);
            nonfinite += bad > 0;
        }
    comm_all_reduce(&comm->world_group, &nonfinite, 1, COMM_I32);
    if (nonfinite) return "non-finite values in the weights or the optimizer's moments";
    // the other replicas get the first replica's shards: host buffers, so over the group's MPI communicator
    // also on the GPU path (a NCCL group's collectives take device buffers, on its stream)
    if (zero_expert_replica(z)->size > 1) {
        CommGroup* g = zero_expert_replica(z);
        int nccl = g->nccl;
        g->nccl = 0;
        for (int k = 0; k < n_arrays; k++) comm_broadcast(g, arrays[k], z->shard_total * sizeof(float), 0);
        g->nccl = nccl;
    }
    z->slot_unit[0] = z->slot_unit[1] = -1;
    // the run's place
    std::string notes, fp8_err, place_err = ckpt_restore_place(man, text, version, z, prog, &fp8_err, &notes);
    if (!place_err.empty()) return place_err;
    int fp8_bad = fp8_err.empty() ? 0 : 1;
    comm_all_reduce(&comm->world_group, &fp8_bad, 1, COMM_I32);
    if (fp8_bad) return fp8_err.empty() ? "the FP8 state is malformed on another rank" : fp8_err;
    if (comm->rank == 0) printf("%s", notes.c_str());
    return "";
}

// After a load, every rank: its GEMM algorithms from the checkpoint's "gemm_plans" (model/matmul_pins.h),
// size and CRC-32C checked like the shard files. A table that is missing (a checkpoint of the CPU build or
// from before tables were saved, or a rank the saving run did not have), damaged or from another library
// is not used: one line, and the heuristic chooses (the weights are fine; only the last bits may differ).
// The CPU backend (either build) has no GEMM plans and ignores the tables.
static inline void ckpt_plans_restore(const std::string& dir, const JsonValue* man, Comm* comm) {
    if (!matmul_pins().device_run) return;
    const JsonValue* list = json_get(man, "gemm_plans");
    std::string name, err, text;
    uint64_t bytes = 0;
    for (size_t i = 0; list && list->kind == JsonValue::ARR && i < list->items.size(); i++) {
        const JsonValue* e = &list->items[i];
        int r = -1;
        if (!json_int(json_get(e, "rank"), &r) || r != comm->rank) continue;
        const JsonValue* nm = json_get(e, "name");
        const JsonValue* cv = json_get(e, "crc32c");
        if (!nm || nm->kind != JsonValue::STR || nm->text != ckpt_plans_name(r) || !json_u64(json_get(e, "bytes"), &bytes) || !cv ||
            cv->kind != JsonValue::STR)
            err = "manifest.json: gemm_plans[" + std::to_string(i) + "] is malformed";
        name = ckpt_plans_name(r);
        if (err.empty()) err = read_file(dir + "/" + name, &text);
        if (err.empty() && text.size() != bytes) err = name + ": " + std::to_string(text.size()) + " bytes, the manifest says " + std::to_string(bytes);
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", crc32c_update(0, text.data(), text.size()));
        if (err.empty() && cv->text != crc) err = name + ": CRC-32C " + crc + ", the manifest says " + cv->text;
        break;
    }
    int n = 0;
    if (!list) {   // none saved at all: one line for the run
        if (comm->rank == 0) printf("note: resume: %s has no GEMM algorithms (saved by the CPU build or an older one): the heuristic "
                                    "chooses them\n", dir.c_str());
        return;
    }
    if (name.empty()) err = "the checkpoint has no GEMM algorithms for rank " + std::to_string(comm->rank);
    else if (err.empty() && !(err = matmul_pins_load(text, &n)).empty()) err = name + ": " + err;
    if (!err.empty()) fprintf(stderr, "note: resume: rank %d: %s: the heuristic chooses the GEMM algorithms (the run may differ from "
                              "the saved one in the last bits)\n", comm->rank, err.c_str());
    else if (comm->rank == 0) printf("resume: %d GEMM algorithms to reuse from %s/%s\n", n, dir.c_str(), name.c_str());
}

// --resume: "auto" = the newest valid checkpoint in ck->dir (none: start fresh, say so), else a
// checkpoint directory (invalid: error). Returns 1 if loaded. Collective.
static inline int ckpt_resume(Checkpointer* ck, const std::string& resume, Zero* z, const DbrxConfig* cfg, TrainProgress* prog,
                              JsonValue* manifest, std::string* loaded, Comm* comm) {
    std::vector<std::string> candidates;
    if (resume == "auto") {
        if (ck->dir.empty()) fail(EXIT_BAD_INPUT, "--resume auto needs --ckpt-dir");
        for (auto& d : list_numbered_dirs(ck->dir, "step_")) candidates.push_back(ck->dir + "/" + d.second);
        if (candidates.empty()) {
            if (comm->rank == 0) printf("resume: no checkpoint in %s: starting fresh\n", ck->dir.c_str());
            return 0;
        }
    } else {
        if (!path_exists(resume)) fail(EXIT_BAD_INPUT, "--resume %s: no such checkpoint directory", resume.c_str());
        candidates.push_back(resume);
    }
    for (const std::string& dir : candidates) {
        std::string why = ckpt_try_load(dir, z, cfg, prog, manifest, comm, ck->weights_only);
        if (why.empty()) {
            *loaded = dir;
            ckpt_plans_restore(dir, manifest, comm);
            // `latest` names the newest valid checkpoint: the one just loaded (a save killed after its
            // rename left it one behind; a damaged newer one is passed over)
            if (resume == "auto" && comm->rank == 0) {
                std::string err = ckpt_point_latest(ck->dir, dir.substr(ck->dir.size() + 1));
                if (!err.empty()) fprintf(stderr, "warning: --ckpt-dir %s: latest not repaired: %s\n", ck->dir.c_str(), err.c_str());
            }
            return 1;
        }
        if (comm->rank == 0) fprintf(stderr, "warning: checkpoint %s is not valid (%s)%s\n", dir.c_str(), why.c_str(),
                                     resume == "auto" && dir != candidates.back() ? "; trying an older one" : "");
    }
    if (comm->rank == 0)
        fail(EXIT_BAD_INPUT, "%s: no valid checkpoint (%zu tried) — refusing to load damaged state", resume == "auto" ?
             ck->dir.c_str() : resume.c_str(), candidates.size());
    exit(EXIT_BAD_INPUT);
}

// Rank 0 warns when the resumed run's schedule, optimizer or global batch differ from the checkpoint's:
// training goes on, but it no longer continues the saved run exactly.
static inline void ckpt_warn_changes(const JsonValue* man, const RunInfo* run, int world, int rank) {
    if (rank != 0) return;
    const JsonValue* lr = json_get(man, "lr_schedule");
    const JsonValue* op = json_get(man, "optimizer");
    const JsonValue* tp = json_get(man, "topology");
    int b = 0, a = 0, w = 0, seq = 0;
    json_int(json_get(tp, "batch"), &b); json_int(json_get(tp, "grad_accum"), &a); json_int(json_get(tp, "world"), &w);
    json_int(json_get(tp, "seq"), &seq);
    struct { const JsonValue* v; double run; const char* what; } f[] = {
        {json_get(lr, "total_steps"), (double)run->total_steps, "--steps"}, {json_get(lr, "warmup_steps"), (double)run->warmup, "--warmup"},
        {json_get(lr, "lr"), (double)run->lr, "--lr"}, {json_get(lr, "lr_floor"), (double)run->lr_floor, "--lr-floor"},
        {json_get(op, "beta1"), (double)run->opt.beta1, "--beta1"}, {json_get(op, "beta2"), (double)run->opt.beta2, "--beta2"},
        {json_get(op, "eps"), (double)run->opt.eps, "--adam-eps"}, {json_get(op, "weight_decay"), (double)run->opt.weight_decay, "--weight-decay"},
        {json_get(op, "grad_clip"), (double)run->opt.grad_clip, "--grad-clip"}, {g_lr_schedule >= LR_WSD ? json_get(lr, "decay_frac") : nullptr, g_lr_decay_frac, "--lr-decay-frac"}};
    for (auto& x : f) {
        double v;
        if (json_double(x.v, &v) && (float)v != (float)x.run)
            printf("warning: resume: %s is %g, the checkpoint was saved with %g: the run will not continue it exactly\n", x.what,
                   x.run, v);
    }
    // the schedule (--lr-schedule; a checkpoint from before session 61 names linear_warmup_cosine)
    const JsonValue* kind = json_get(lr, "kind");
    std::string was = kind && kind->kind == JsonValue::STR ? kind->text : "linear_warmup_cosine";
    if (was != std::string("linear_warmup_") + LR_SCHEDULE_NAMES[g_lr_schedule])
        printf("warning: resume: --lr-schedule is %s, the checkpoint was saved with %s: the run will not continue it exactly\n",
               LR_SCHEDULE_NAMES[g_lr_schedule], was.c_str());
    // the moments' dtype (--adam-moments; a checkpoint from before session 50 has none: FP32). The checkpoint's moments
    // are FP32 either way (a BF16 run's exactly its BF16 values): fp32 -> bf16 rounds them, bf16 -> fp32 keeps them
    const JsonValue* mo = json_get(op, "moments");
    std::string saved = mo && mo->kind == JsonValue::STR ? mo->text : "fp32", now = g_adam_moments_bf16 ? "bf16" : "fp32";
    if (saved != now)
        printf("warning: resume: --adam-moments is %s, the checkpoint was saved with %s: the run will not continue it exactly\n",
               now.c_str(), saved.c_str());
    if ((long long)b * a * w != (long long)run->batch * run->grad_accum * world || seq != run->seq)
        printf("warning: resume: the global batch is %d x %d x %d ranks of %d tokens, the checkpoint's was %d x %d x %d of %d\n",
               run->batch, run->grad_accum, world, run->seq, b, a, w, seq);
}
