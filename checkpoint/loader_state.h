/*
 * loader_state.h — THE SEAM between checkpoints and the data loader: the loader's resumable state as
 * one JSON value in the manifest ("data_loader"), and back. Nothing else in checkpoint/ knows what a
 * DataLoader holds.
 *
 * Today's loader (data/dataloader.h) resumes from (shard_index, position): its place in the stream of
 * global batches, the same on every rank. When the seeded, rank-independent loader lands, these two
 * functions become:
 *   save:    DataLoaderState st; dataloader_get_state(dl, &st); return dataloader_state_write(&st);
 *   restore: dataloader_state_parse(text, &st, err) && (dataloader_set_state(dl, &st, what), true)
 */
#pragma once
#include <string>
#include "../data/dataloader.h"
#include "json.h"

static inline std::string ckpt_loader_state_save(const DataLoader* dl) {
    char buf[160];
    snprintf(buf, sizeof buf, "{\"kind\": \"sequential\", \"shard_index\": %zu, \"position\": %lld}", dl->shard_index,
             (long long)dl->position);
    return buf;
}

// text: the JSON value written by ckpt_loader_state_save. Returns 1, or 0 with *err set.
static inline int ckpt_loader_state_restore(DataLoader* dl, const std::string& text, std::string* err) {
    JsonValue v;
    if (!json_parse(text.c_str(), text.size(), &v, err)) return 0;
    const JsonValue* kind = json_get(&v, "kind");
    uint64_t shard = 0;
    int64_t pos = 0;
    if (!kind || kind->text != "sequential" || !json_u64(json_get(&v, "shard_index"), &shard) ||
        !json_i64(json_get(&v, "position"), &pos) || pos < 0) {
        *err = "is not a sequential data loader state {kind, shard_index, position}";
        return 0;
    }
    if (shard >= dl->shards.size() || pos > dl->shards[shard].num_tokens) {
        *err = "points at shard " + std::to_string(shard) + " position " + std::to_string(pos) + ", but --data has " +
               std::to_string(dl->shards.size()) + " shard(s): the data changed";
        return 0;
    }
    dl->shard_index = (size_t)shard;
    dl->position = pos;
    return 1;
}
