/*
 * dump_reference.cpp — runs the CPU reference on a small DBRX config with a fixed batch and writes
 * everything the PyTorch parity test compares (test/test_pytorch_parity.py): the config, the batch,
 * the initial weights (Hugging Face names), the logits, the three losses, every gradient of the
 * total loss, and the CE / LBL losses of `train_steps` AdamW steps on the same batch.
 *   dump_reference OUT.bin
 */
#include <string>
#include "../model/dbrx.h"
#include "tensor_dump.h"

int main(int argc, char** argv) {
    if (argc != 2) fail(EXIT_BAD_INPUT, "usage: dump_reference OUT.bin");
    DbrxConfig c;
    c.d_model = 32; c.n_heads = 4; c.kv_heads = 2; c.head_dim = 8; c.n_layers = 2; c.ffn_hidden = 24;
    c.n_experts = 8; c.top_k = 2; c.vocab_size = 64; c.max_seq_len = 16; c.rope_theta = 10000.0f;
    c.clip_qkv = 0.5f;   // small, with init_std 0.1, so a good share of the qkv values is clamped
    c.ln_eps = 1e-5f; c.moe_loss_weight = 0.05f; c.z_loss_weight = 0.001f; c.init_std = 0.1f;
    const int B = 2, T = 16, steps = 10, warmup = 2;
    AdamWConfig opt = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    const float lr_floor = 0.1f;

    Dbrx m;
    dbrx_build(&m, &c, B, T, 42);
    std::vector<int> inputs(B * T), targets(B * T);
    Rng rng = {7};
    for (int i = 0; i < B * T; i++) { inputs[i] = (int)(rng_u64(&rng) % c.vocab_size); targets[i] = (int)(rng_u64(&rng) % c.vocab_size); }

    FILE* f = fopenCheck(argv[1], "wb");
    fwriteCheck("DBRXDUMP", 1, 8, f, "magic");
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"d_model\": %d, \"n_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"n_layers\": %d, \"ffn_hidden\": %d, "
             "\"n_experts\": %d, \"top_k\": %d, \"vocab_size\": %d, \"rope_theta\": %.9g, \"clip_qkv\": %.9g, \"ln_eps\": %.9g, "
             "\"moe_loss_weight\": %.9g, \"z_loss_weight\": %.9g, \"B\": %d, \"T\": %d, \"lr\": %.9g, \"warmup_steps\": %d, "
             "\"train_steps\": %d, \"lr_floor_frac\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"adam_eps\": %.9g, "
             "\"weight_decay\": %.9g, \"grad_clip\": %.9g}",
             c.d_model, c.n_heads, c.kv_heads, c.head_dim, c.n_layers, c.ffn_hidden, c.n_experts, c.top_k, c.vocab_size,
             c.rope_theta, c.clip_qkv, c.ln_eps, c.moe_loss_weight, c.z_loss_weight, B, T, opt.lr, warmup, steps,
             lr_floor, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.grad_clip);
    dump_text(f, "config", cfg);
    dump_record(f, "inputs", 1, {B, T}, inputs.data(), 4);
    dump_record(f, "targets", 1, {B, T}, targets.data(), 4);
    auto dims = [](const ParamInfo& p) { return p.cols ? std::vector<int64_t>{p.rows, p.cols} : std::vector<int64_t>{p.rows}; };
    for (const ParamInfo& p : m.table) dump_real(f, p.name, dims(p), m.params + p.offset);

    dbrx_zero_grad(&m);
    dbrx_forward(&m, inputs.data(), targets.data());
    dump_real(f, "logits", {B, T, c.vocab_size}, m.logits);
    float ce = (float)m.ce_loss, lbl = (float)m.lbl_loss, z = (float)m.z_loss;
    dump_record(f, "ce_loss", 0, {1}, &ce, 4);
    dump_record(f, "lbl_loss", 0, {1}, &lbl, 4);
    dump_record(f, "z_loss", 0, {1}, &z, 4);
    dbrx_backward(&m, inputs.data(), targets.data(), 1.0f);
    for (const ParamInfo& p : m.table) dump_real(f, std::string("grad/") + p.name, dims(p), m.grads + p.offset);

    // steps of AdamW on the same batch, from the initial weights (the gradients above are step 0's)
    std::vector<float> train_ce, train_lbl;
    for (int s = 0; s < steps; s++) {
        if (s > 0) {
            dbrx_zero_grad(&m);
            dbrx_forward(&m, inputs.data(), targets.data());
            dbrx_backward(&m, inputs.data(), targets.data(), 1.0f);
        }
        train_ce.push_back((float)m.ce_loss);
        train_lbl.push_back((float)m.lbl_loss);
        dbrx_update(&m, &opt, lr_schedule(s, steps, opt.lr, warmup, lr_floor), s + 1);
    }
    dump_record(f, "train_ce", 0, {steps}, train_ce.data(), 4);
    dump_record(f, "train_lbl", 0, {steps}, train_lbl.data(), 4);
    fcloseCheck(f, argv[1]);
    dbrx_free(&m);
    return 0;
}
