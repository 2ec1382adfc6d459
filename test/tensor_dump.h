/*
 * tensor_dump.h — writes named tensors to a small binary file read by the Python tests:
 *   "DBRXDUMP", then records: int32 name_len, name, int32 dtype (0 f32, 1 i32, 2 f64, 3 utf-8),
 *   int32 ndim, int64 dims[ndim], data.
 */
#pragma once
#include <string>
#include <vector>
#include "../model/common.h"

static inline void dump_record(FILE* f, const std::string& name, int dtype, const std::vector<int64_t>& dims,
                               const void* data, size_t elem_bytes) {
    int32_t len = (int32_t)name.size(), nd = (int32_t)dims.size();
    size_t n = 1;
    for (int64_t d : dims) n *= (size_t)d;
    fwriteCheck(&len, 4, 1, f, "dump name length");
    fwriteCheck(name.data(), 1, name.size(), f, "dump name");
    fwriteCheck(&dtype, 4, 1, f, "dump dtype");
    fwriteCheck(&nd, 4, 1, f, "dump ndim");
    fwriteCheck(dims.data(), 8, dims.size(), f, "dump dims");
    fwriteCheck(data, elem_bytes, n, f, name.c_str());
}
// float32 record from `real` data (converted when real is double)
static inline void dump_real(FILE* f, const std::string& name, const std::vector<int64_t>& dims, const real* x) {
    size_t n = 1;
    for (int64_t d : dims) n *= (size_t)d;
    std::vector<float> tmp(x, x + n);
    dump_record(f, name, 0, dims, tmp.data(), 4);
}
static inline void dump_text(FILE* f, const std::string& name, const std::string& text) {
    dump_record(f, name, 3, {(int64_t)text.size()}, text.data(), 1);
}
