/*
 * loader_state.h — THE SEAM between checkpoints and the data loader: the loader's resumable state as
 * one JSON value in the manifest ("data_loader"), and back. Nothing else in checkpoint/ knows what a
 * DataLoader holds.
 *
 * The loader (data/dataloader.h) resumes from its DataLoaderState (seed, global position, batches
 * served, and per source its position): the same on every rank and independent of the number of
 * ranks, so a checkpoint can be resumed under another topology.
 */
#pragma once
#include <string>
#include "../data/dataloader.h"
#include "json.h"

static inline std::string ckpt_loader_state_save(const DataLoader* dl) {
    DataLoaderState st;
    dataloader_get_state(dl, &st);
    std::string line = dataloader_state_write(&st);
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    return line;
}

// text: the JSON value written by ckpt_loader_state_save. Returns 1, or 0 with *err set; a state taken
// over other data or another --seq stops the run (bad input) naming `what`.
static inline int ckpt_loader_state_restore(DataLoader* dl, const std::string& text, std::string* err,
                                            const char* what = "checkpoint manifest") {
    DataLoaderState st;
    if (!dataloader_state_parse(text.c_str(), &st, err)) return 0;
    dataloader_set_state(dl, &st, what);
    return 1;
}
