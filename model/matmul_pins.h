/*
 * matmul_pins.h — the GEMM algorithms a run uses, pinned across restarts. cuBLASLt's heuristic may
 * answer differently in a restarted process (free memory, the order shapes are first seen), and another
 * algorithm sums in another order: a resumed run would not continue the saved one bit for bit. So every
 * plan the cache makes records its algorithm here (cublasLtMatmulAlgo_t: 8 uint64 of opaque data; the
 * emulated twin records a fake id), checkpoint/ckpt.h saves this rank's table with the checkpoint, and on
 * resume the table is loaded back: a plan made for a pinned key takes the saved algorithm (on the device
 * after cublasLtMatmulAlgoCheck accepts it) instead of asking the heuristic.
 * The text (one file per rank, gemm_plans_<rank>.txt):
 *   train_dbrx gemm plans 1
 *   library <the cuBLASLt version, or "twin">
 *   <24 key numbers (MatmulKey, model/matmul.cuh)> : <8 algorithm words, hex>      one line per plan
 * Pure C++ (no CUDA types): the CPU build has no plans and writes no file.
 */
#pragma once
#include <array>
#include <cinttypes>
#include <map>
#include <string>

typedef std::array<long long, 24> MatmulKey;   // (the same typedef as model/matmul.cuh's)
typedef std::array<uint64_t, 8> MatmulAlgoWords;

typedef struct {
    std::map<MatmulKey, MatmulAlgoWords> used;     // every plan of this process: key -> its algorithm
    std::map<MatmulKey, MatmulAlgoWords> pinned;   // loaded from the checkpoint resumed from
    std::string library;                           // the library that chose the algorithms (set by the backend)
    bool device_run = false;                       // this run's GEMMs go through cuBLASLt (set by the CUDA set-up; an
                                                   // nvcc build on --device cpu has a library but no plans)
    long long pins_taken = 0, pins_refused = 0;    // plans made from a pin; pins the library refused
    bool warned = false;
} MatmulPins;

static inline MatmulPins& matmul_pins() { static MatmulPins p; return p; }

// a plan's algorithm, as chosen (from a pin or the heuristic)
static inline void matmul_pin_record(const MatmulKey& key, const MatmulAlgoWords& algo) { matmul_pins().used[key] = algo; }

// the pinned algorithm of key, if the checkpoint had one
static inline bool matmul_pin_find(const MatmulKey& key, MatmulAlgoWords* algo) {
    auto it = matmul_pins().pinned.find(key);
    if (it == matmul_pins().pinned.end()) return false;
    *algo = it->second;
    return true;
}

// a pin the library refused (another GPU or cuBLAS version): one line for the process, then the heuristic
static inline void matmul_pin_refused(const char* why) {
    MatmulPins& p = matmul_pins();
    p.pins_refused++;
    if (!p.warned) fprintf(stderr, "warning: a GEMM algorithm saved with the checkpoint is refused here (%s): the heuristic chooses "
                           "instead, and the resumed run may differ from the saved one in the last bits\n", why);
    p.warned = true;
}

// this rank's table: the plans used, and the pins loaded but not used yet (so that they carry over to
// the next checkpoint); "" when there are none (the CPU build)
static inline std::string matmul_pins_text() {
    MatmulPins& p = matmul_pins();
    std::map<MatmulKey, MatmulAlgoWords> all = p.pinned;
    for (auto& u : p.used) all[u.first] = u.second;
    if (all.empty()) return "";
    std::string t = "train_dbrx gemm plans 1\nlibrary " + p.library + "\n";
    char b[64];
    for (auto& e : all) {
        for (long long v : e.first) { snprintf(b, sizeof b, "%lld ", v); t += b; }
        t += ":";
        for (uint64_t w : e.second) { snprintf(b, sizeof b, " %016" PRIx64, w); t += b; }
        t += "\n";
    }
    return t;
}

// text -> the pinned table; "" or what is wrong (line number). A table from another library is
// refused as a whole (its algorithms are that library's), with the reason.
static inline std::string matmul_pins_load(const std::string& text, int* n_loaded) {
    MatmulPins& p = matmul_pins();
    std::map<MatmulKey, MatmulAlgoWords> pinned;
    size_t pos = 0;
    int line = 0;
    std::string lib;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) return "line " + std::to_string(line + 1) + " has no end";
        std::string l = text.substr(pos, end - pos);
        pos = end + 1;
        line++;
        if (line == 1) { if (l != "train_dbrx gemm plans 1") return "line 1 is not 'train_dbrx gemm plans 1'"; continue; }
        if (line == 2) { if (l.compare(0, 8, "library ") != 0) return "line 2 does not name the library"; lib = l.substr(8); continue; }
        MatmulKey k;
        MatmulAlgoWords a;
        const char* c = l.c_str();
        int used = 0;
        for (long long& v : k) {
            if (sscanf(c, "%lld %n", &v, &used) != 1) return "line " + std::to_string(line) + ": not 24 key numbers";
            c += used;
        }
        if (*c != ':') return "line " + std::to_string(line) + ": no ':' after the key";
        c++;
        for (uint64_t& w : a) {
            if (sscanf(c, " %" SCNx64 "%n", &w, &used) != 1) return "line " + std::to_string(line) + ": not 8 algorithm words";
            c += used;
        }
        if (*c) return "line " + std::to_string(line) + ": text after the algorithm";
        pinned[k] = a;
    }
    if (line < 2) return "no header";
    if (lib != p.library) return "chosen by " + lib + ", this run has " + p.library;
    p.pinned = pinned;
    *n_loaded = (int)pinned.size();
    return "";
}
