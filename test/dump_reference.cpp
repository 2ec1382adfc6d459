/*
 * dump_reference.cpp — runs the CPU reference on a small DBRX config with a fixed batch and writes
 * everything the PyTorch parity test compares (test/test_pytorch_parity.py): the config, the batch,
 * the initial weights (Hugging Face names), the logits, the three losses, every gradient of the
 * total loss, and the CE / LBL losses of `train_steps` AdamW steps on the same batch (and of as many LionW
 * steps, --optimizer lion, at lion_lr); and the RoPE
 * tables of DBRX's own shape (head_dim 128, theta 5e5) at positions up to 32767, which the test
 * compares with the original DBRX code's fp32 computation in torch.
 *   dump_reference OUT.bin [P|off [doc]]   P: moe_normalize_expert_weights (default 1, DBRX's; off: none); doc: the
 *                                          document mask (--doc-mask) on, end-of-text token 5 at set places of the batch
 */
#include <string>
#include "../model/dbrx.h"
#include "tensor_dump.h"

int main(int argc, char** argv) {
    if (argc < 2 || argc > 4 || (argc == 4 && strcmp(argv[3], "doc"))) fail(EXIT_BAD_INPUT, "usage: dump_reference OUT.bin [P|off [doc]]");
    if (argc == 4) g_doc_mask_eot = 5;
    DbrxConfig c;
    c.d_model = 32; c.n_heads = 4; c.kv_heads = 2; c.head_dim = 8; c.n_layers = 2; c.ffn_hidden = 24;
    c.n_experts = 8; c.top_k = 2; c.vocab_size = 64; c.max_seq_len = 16; c.rope_theta = 10000.0f;
    c.clip_qkv = 0.5f;   // small, with init_std 0.1, so a good share of the qkv values is clamped
    c.moe_norm_p = 1.0f;
    if (argc >= 3 && !strcmp(argv[2], "off")) c.moe_norm_p = DBRX_OFF;
    else if (argc >= 3) {
        char* end = NULL;
        c.moe_norm_p = strtof(argv[2], &end);
        if (*end || !(c.moe_norm_p >= 1)) fail(EXIT_BAD_INPUT, "dump_reference: moe_normalize_expert_weights '%s' is not a p >= 1 or off", argv[2]);
    }
    c.ln_eps = 1e-5f; c.moe_loss_weight = 0.05f; c.z_loss_weight = 0.001f; c.init_std = 0.1f;
    const int B = 2, T = 16, steps = 10, warmup = 2;
    AdamWConfig opt = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    const float lr_floor = 0.1f, lion_lr = opt.lr / 3;   // (LionW's step wants a smaller lr: model/adamw.cuh)

    Dbrx m;
    dbrx_build(&m, &c, B, T, 42);
    std::vector<int> inputs(B * T), targets(B * T);
    Rng rng = {7};
    for (int i = 0; i < B * T; i++) { inputs[i] = (int)(rng_u64(&rng) % c.vocab_size); targets[i] = (int)(rng_u64(&rng) % c.vocab_size); }
    if (g_doc_mask_eot >= 0)   // documents of 3, 1, 5 and 7 tokens in sequence 0; sequence 1's first began before it
        for (int t : {0, 3, 4, 9, T + 7, T + 15}) inputs[t] = g_doc_mask_eot;

    FILE* f = fopenCheck(argv[1], "wb");
    fwriteCheck("DBRXDUMP", 1, 8, f, "magic");
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"d_model\": %d, \"n_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"n_layers\": %d, \"ffn_hidden\": %d, "
             "\"n_experts\": %d, \"top_k\": %d, \"vocab_size\": %d, \"rope_theta\": %.9g, \"clip_qkv\": %.9g, "
             "\"moe_normalize_expert_weights\": %s, \"ln_eps\": %.9g, "
             "\"moe_loss_weight\": %.9g, \"z_loss_weight\": %.9g, \"B\": %d, \"T\": %d, \"lr\": %.9g, \"warmup_steps\": %d, "
             "\"train_steps\": %d, \"lr_floor_frac\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"adam_eps\": %.9g, "
             "\"weight_decay\": %.9g, \"grad_clip\": %.9g, \"lion_lr\": %.9g, \"doc_mask_eot\": %s}",
             c.d_model, c.n_heads, c.kv_heads, c.head_dim, c.n_layers, c.ffn_hidden, c.n_experts, c.top_k, c.vocab_size,
             c.rope_theta, c.clip_qkv, dbrx_is_off(c.moe_norm_p) ? "null" : std::to_string(c.moe_norm_p).c_str(), c.ln_eps, c.moe_loss_weight, c.z_loss_weight, B, T, opt.lr, warmup, steps,
             lr_floor, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.grad_clip, lion_lr,
             g_doc_mask_eot >= 0 ? std::to_string(g_doc_mask_eot).c_str() : "null");
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

    // `steps` steps of the optimizer on the same batch from the initial weights (AdamW's model m: its first gradients
    // are those above, computed again), their CE and LBL losses dumped as NAME_ce, NAME_lbl
    auto train = [&](Dbrx* mm, const AdamWConfig* o, const char* name) {
        std::vector<float> ce, lbl;
        for (int s = 0; s < steps; s++) {
            dbrx_zero_grad(mm);
            dbrx_forward(mm, inputs.data(), targets.data());
            dbrx_backward(mm, inputs.data(), targets.data(), 1.0f);
            ce.push_back((float)mm->ce_loss);
            lbl.push_back((float)mm->lbl_loss);
            dbrx_update(mm, o, lr_schedule(s, steps, o->lr, warmup, lr_floor), s + 1);
        }
        dump_record(f, std::string(name) + "_ce", 0, {steps}, ce.data(), 4);
        dump_record(f, std::string(name) + "_lbl", 0, {steps}, lbl.data(), 4);
    };
    train(&m, &opt, "train");
    // the same with LionW (--optimizer lion), from the initial weights again, at lion_lr
    Dbrx ml;
    dbrx_build(&ml, &c, B, T, 42);
    AdamWConfig lion = opt;
    lion.lr = lion_lr;
    g_optimizer_lion = 1;
    train(&ml, &lion, "lion");
    g_optimizer_lion = 0;
    dbrx_free(&ml);

    // RoPE at DBRX's shape: every frequency, and the tables (rope_tables, which both backends use) at
    // positions from 0 to 32767, where an ulp of a frequency has moved the angle the most
    const int rhd = 128, rhalf = rhd / 2, rT = 32768;
    const float rtheta = 500000.0f;
    std::vector<float> inv(rhalf);
    for (int i = 0; i < rhalf; i++) inv[i] = rope_inv_freq(i, rhd, rtheta);
    std::vector<real> ct((size_t)rT * rhalf), st((size_t)rT * rhalf);
    rope_tables(ct.data(), st.data(), rT, rhd, rtheta);
    std::vector<int> pos = {0, 1, 2, 3, 7, 100, 1000, 2047, 4095, 8191, 10000, 16384, 20000, 24575, 30000, 32766, 32767};
    std::vector<float> pc, ps;
    for (int p : pos) {
        pc.insert(pc.end(), ct.begin() + (size_t)p * rhalf, ct.begin() + (size_t)(p + 1) * rhalf);
        ps.insert(ps.end(), st.begin() + (size_t)p * rhalf, st.begin() + (size_t)(p + 1) * rhalf);
    }
    const int64_t P = (int64_t)pos.size();
    dump_record(f, "rope/inv_freq", 0, {rhalf}, inv.data(), 4);
    dump_record(f, "rope/positions", 1, {P}, pos.data(), 4);
    dump_record(f, "rope/cos", 0, {P, rhalf}, pc.data(), 4);
    dump_record(f, "rope/sin", 0, {P, rhalf}, ps.data(), 4);
    fcloseCheck(f, argv[1]);
    dbrx_free(&m);
    return 0;
}
