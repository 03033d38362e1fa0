// llama_oracle.cpp: llama.cpp's own answer for one model and one prompt, for minfer's golden data.
//
// Loads a GGUF with libllama (CPU), tokenizes the prompt as llama.cpp does (special tokens
// added and parsed), runs it as one batch with logits at every position, then decodes
// n_predict tokens greedily one at a time (never stopping at an end-of-generation token).
// Writes OUT.json: {"ids": [...], "n_vocab": V, "greedy": [...], "margins": [...]} (margins:
// top-1 minus top-2 logit at each greedy step) and OUT.f32: the prompt's logits, float32
// [n_prompt, n_vocab] row-major.
//
// Build (scripts/llama_oracle.py does it): against a llama.cpp CPU build tree,
//   g++ -O2 -std=c++17 llama_oracle.cpp -I$LL/include -I$LL/ggml/include \
//       -L$LL/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LL/build/bin
// Usage: llama_oracle MODEL PROMPT_FILE OUT [n_predict=32] [n_ctx]
// n_ctx: the context (llama_context_params.n_ctx; 0: the model's own, as llama.cpp's -c 0);
// default n_prompt + n_predict + 8. It decides phi3's long / short RoPE factors.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void die(const char* what) {
    std::fprintf(stderr, "llama_oracle: %s\n", what);
    std::exit(1);
}

static int argmax2(const float* l, int n, float* margin) {
    int best = 0, second = -1;
    for (int i = 1; i < n; ++i) {
        if (l[i] > l[best]) { second = best; best = i; }
        else if (second < 0 || l[i] > l[second]) second = i;
    }
    *margin = l[best] - l[second];
    return best;
}

int main(int argc, char** argv) {
    if (argc < 4) die("usage: llama_oracle MODEL PROMPT_FILE OUT [n_predict] [n_ctx]");
    const int n_predict = argc > 4 ? std::atoi(argv[4]) : 32;
    std::ifstream pf(argv[2], std::ios::binary);
    if (!pf) die("cannot read the prompt file");
    std::stringstream ss;
    ss << pf.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> ids(text.size() + 16);
    int n = llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), (int)ids.size(),
                           true, true);
    if (n < 0) die("tokenize failed");
    ids.resize(n);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = argc > 5 ? (uint32_t)std::atoi(argv[5]) : (uint32_t)(n + n_predict + 8);
    cp.n_batch = cp.n_ubatch = n;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create the context");

    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) die("prompt decode failed");

    std::string out = argv[3];
    FILE* f = std::fopen((out + ".f32").c_str(), "wb");
    if (!f) die("cannot write OUT.f32");
    for (int i = 0; i < n; ++i) std::fwrite(llama_get_logits_ith(ctx, i), 4, n_vocab, f);
    std::fclose(f);

    std::vector<int> greedy;
    std::vector<float> margins;
    float m;
    llama_token tok = argmax2(llama_get_logits_ith(ctx, n - 1), n_vocab, &m);
    for (int s = 0; s < n_predict; ++s) {
        greedy.push_back(tok);
        margins.push_back(m);
        if (s + 1 == n_predict) break;
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) die("decode failed");
        tok = argmax2(llama_get_logits_ith(ctx, -1), n_vocab, &m);
    }

    FILE* j = std::fopen((out + ".json").c_str(), "w");
    if (!j) die("cannot write OUT.json");
    std::fprintf(j, "{\"n_vocab\": %d, \"ids\": [", n_vocab);
    for (int i = 0; i < n; ++i) std::fprintf(j, "%s%d", i ? ", " : "", ids[i]);
    std::fprintf(j, "], \"greedy\": [");
    for (size_t i = 0; i < greedy.size(); ++i) std::fprintf(j, "%s%d", i ? ", " : "", greedy[i]);
    std::fprintf(j, "], \"margins\": [");
    for (size_t i = 0; i < margins.size(); ++i)
        std::fprintf(j, "%s%.6g", i ? ", " : "", margins[i]);
    std::fprintf(j, "]}\n");
    std::fclose(j);

    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
