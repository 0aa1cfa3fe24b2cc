// Sampling: continues a sequence of tokens with the model, one token at a time, on every rank of the run (each rank
// draws the same token). With the KV cache (the default) the prompt goes through the model once and every later
// token is one new position: each block keeps the keys and values of the positions before in its qkv buffer
// (Transformer::kv_position, kernels/attention_decode.cuh). Once the sequence is longer than the model's T, each token
// re-runs a window of the last T tokens from position 0, as without the cache (GPT-2's positions end at T).
// Under --recompute 3 the blocks share one qkv buffer, so there is no cache to keep: each token re-runs the window.
// What it leaves to others: the forward (transformer.cuh; through every stage, distributed/pipeline_parallel.cuh),
// the prompt's tokens and the text (train_gpt.cu's SampleText).
// defines: SamplingRule, choose_token, generate
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>
#include "../kernels/common.cuh"
#include "../kernels/matmul.cuh"                  // defines: matmul_context (autotuning, switched off while sampling)
#include "../distributed/pipeline_parallel.cuh"  // defines: forward_all_stages
#include "transformer.cuh"

struct SamplingRule {
    float temperature = 1.0f;  // 0: the most likely token (the first of equals)
    int top_k = 0;             // draw from the k most likely tokens; 0: from all
    uint64_t seed = 0;
    bool kv_cache = true;
    std::vector<int> end_tokens;  // a drawn token among these is the last one (the tokenizer's end of text); empty: none
};

// The next token from one position's logits: the most likely one at temperature 0, else a draw from the softmax of
// logits / temperature over the top_k most likely tokens (all without top_k), with the uniform number of
// splitmix64(seed + i). One pass over the vocabulary for the top k (a heap of the best so far: most tokens fail one
// comparison) and one for the exponentials: the host's share of a token stays small next to the GPU's forward.
inline int choose_token(const std::vector<float>& logits, const SamplingRule& rule, int i, std::vector<std::pair<float, int>>& candidates,
                        std::vector<float>& weights) {
    const int V = (int)logits.size();
    if (rule.temperature == 0.0f) return (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const int k = (rule.top_k > 0 && rule.top_k < V) ? rule.top_k : V;
    candidates.clear();
    if (k < V) {  // the k largest, most likely first (ties by index: a fixed order)
        auto more_likely = [](const std::pair<float, int>& a, const std::pair<float, int>& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
        for (int j = 0; j < V; j++) {
            const std::pair<float, int> c{logits[j], j};
            if ((int)candidates.size() < k) {
                candidates.push_back(c);
                std::push_heap(candidates.begin(), candidates.end(), more_likely);  // the front: the least likely kept
            } else if (more_likely(c, candidates.front())) {
                std::pop_heap(candidates.begin(), candidates.end(), more_likely);
                candidates.back() = c;
                std::push_heap(candidates.begin(), candidates.end(), more_likely);
            }
        }
        std::sort(candidates.begin(), candidates.end(), more_likely);
    } else {
        for (int j = 0; j < V; j++) candidates.push_back({logits[j], j});
    }
    float max_logit = -INFINITY;
    for (const auto& c : candidates) max_logit = std::max(max_logit, c.first);
    weights.resize(k);
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += weights[j] = expf((candidates[j].first - max_logit) / rule.temperature);
    const double u = (splitmix64(rule.seed + i) >> 11) * (1.0 / 9007199254740992.0) * sum;
    double acc = 0.0;
    for (int j = 0; j < k; j++) {
        acc += weights[j];
        if (u < acc) return candidates[j].second;
    }
    return candidates[k - 1].second;
}

// Whether a KV cache can be kept: each block needs its own qkv buffer (not under --recompute 3).
template <typename floatX>
bool can_keep_kv_cache(const Transformer<floatX>& model) { return model.recompute < kRecomputeBlock; }

// Appends `count` tokens to `tokens` (which holds at least one), or fewer when one of rule.end_tokens is drawn (it is
// kept, the last); B = 1 while sampling, the model's T the window.
template <typename floatX>
std::vector<int> generate(Transformer<floatX>& model, std::vector<int> tokens, int count, const SamplingRule& rule) {
    const int B = model.B, T = model.T, Vp = model.config.padded_vocab_size, V = model.config.vocab_size;
    const int Vl = model.layout.vocab_rows();
    const bool kv_cache = rule.kv_cache && can_keep_kv_cache(model);
    // every new length is a new product shape, run once: timing its candidates would cost more than it saves
    const bool autotune = matmul_context().autotune;
    matmul_context().autotune = false;
    floatX* row;  // the last position's logits, whole (their columns are spread over tensor-parallel ranks)
    cudaCheck(cudaMalloc(&row, Vp * sizeof(floatX)));
    std::vector<float> logits;
    std::vector<std::pair<float, int>> candidates;
    std::vector<float> weights;
    std::vector<int> rows;
    int cached = 0;  // positions of tokens[0, cached) whose keys and values are in the qkv buffers
    // sequence parallelism splits the rows evenly: the rows are padded at their end, which the causal attention keeps
    // from changing the positions before (T is a multiple of the split); a padded row's keys are overwritten later
    const int split = model.sequence_split();
    for (int i = 0; i < count; i++) {
        const int n = (int)tokens.size();
        // one new position on the cache, or a whole window of at most T tokens from position 0
        const bool decode = kv_cache && cached == n - 1 && cached + split <= T;
        const int first = decode ? n - 1 : std::max(0, n - T);
        const int t = n - first;  // real rows
        rows.assign(tokens.begin() + first, tokens.end());
        rows.resize((t + split - 1) / split * split, 0);
        model.B = 1;
        model.T = (int)rows.size();
        model.kv_position = decode ? cached : 0;
        model.upload_batch(rows.data(), nullptr);
        forward_all_stages(model, false);
        cached = first == 0 || decode ? n : 0;
        // the logits are on the last pipeline stage, which sends the row to the others: every rank draws the same token
        if (model.layout.part.last) model.tensor_parallel.all_gather(model.logits + (size_t)(t - 1) * Vl, row, Vl, model.stream);
        const Communicator& stages = model.mesh.pipeline;
        if (stages.size > 1) ncclCheck(ncclBroadcast(row, row, Vp, nccl_type<floatX>(), stages.size - 1, stages.comm, model.stream));
        model.pg.synchronize(model.stream);
        logits = device_to_host_floats(row, V);
        tokens.push_back(choose_token(logits, rule, i, candidates, weights));
        if (std::find(rule.end_tokens.begin(), rule.end_tokens.end(), tokens.back()) != rule.end_tokens.end()) break;
    }
    cudaCheck(cudaFree(row));
    model.B = B;
    model.T = T;
    model.kv_position = 0;
    matmul_context().autotune = autotune;
    return tokens;
}
