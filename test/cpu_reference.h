// Plain C++17 fp32 CPU reference of GPT-2 forward, backward and AdamW, and of the Llama family's layers: the ground
// truth for GPU kernel tests.
//
// Conventions (as llm.c's train_gpt2.c):
// - N is the number of rows, B*T. Tensors are row-major; Linear weights are (out, in): y = x W^T + b.
// - Every backward function ACCUMULATES (+=) into all of its gradient outputs, dinp included.
// - Long reductions are accumulated in double so results match PyTorch's fp32 to ~1e-6 relative.
// - Parameters, gradients and optimizer state of a Model are flat arrays in model-file (llm.c) order
//   (docs/formats.md).
// - A Model can fine-tune with LoRA adapters (model_enable_lora / lora_load below; docs/lora.md).
#pragma once

#include <cstddef>
#include <string>

namespace cpuref {

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C);

// eps 1e-5, biased variance; mean and rstd are (N).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dweight and dbias may be null (a frozen LayerNorm: only dinp).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] * weight[OC,C]^T + bias; bias/dbias may be null, and so may dweight (a frozen weight:
// the backward then skips the weight-gradient product).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// Causal self-attention with grouped-query heads (GQA): qkv (B,T,(NH+2*KVH)*D) with each row laid out as
// [q: NH*D | k: KVH*D | v: KVH*D], head h in columns h*D..h*D+D-1 of its part; query head h uses kv head
// h / (NH/KVH) (NH a multiple of KVH; transformers' repeat_kv). preatt, att (B,NH,T,T); out (B,T,NH*D). Scale
// 1/sqrt(D). Masked entries (key t2 > query t) of preatt and att are set to 0, and the backward leaves the masked
// entries of dpreatt and datt untouched. The backward propagates the totals it accumulates in datt and dpreatt,
// so those start at zero.
void gqa_attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int NH, int KVH,
                           int D);
void gqa_attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                            const float* att, int B, int T, int NH, int KVH, int D);
// GPT-2's multi-head attention: the above with KVH = NH and D = C/NH, so qkv is (B,T,3C) and out (B,T,C).
void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

// tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int N);
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);

void residual_forward(float* out, const float* a, const float* b, int N);
void residual_backward(float* da, float* db, const float* dout, int N);

// A target that does not count (masked chat data; kernels/classifier.cuh's kIgnoredTarget): its row's loss is 0,
// its gradient 0, and the mean loss is over the other rows.
constexpr int kIgnoredTarget = -1;
int counted_targets(const int* targets, int N);  // the rows whose target is not kIgnoredTarget

// logits rows have stride Vp; only the first V columns are real. probs gets the softmax over V columns
// (padded columns 0); losses (N) = -log p(target), 0 for kIgnoredTarget.
void softmax_crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, int N, int V,
                                  int Vp);
// dlogits (+=) = (probs - onehot(target)) * dloss_per_row; padded columns and kIgnoredTarget rows untouched.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss_per_row, int N,
                                   int V, int Vp);

// docs/formats.md AdamW, t = 1-based step: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr (mhat / (sqrt(vhat) + eps) + wd p).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t);
double global_norm(const float* grad, size_t n);

// ---- Llama family layers (Llama 3, Qwen 2.5, SmolLM2, Mistral), as transformers computes them in fp32.

// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight over each row of C (no mean subtraction, no bias); rstd (N).
// eps is the model's rms_norm_eps (Llama 3 and SmolLM2 1e-5, Qwen 2.5 1e-6). dweight may be null (frozen).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);

// rope_scaling with rope_type "llama3" (Llama 3.1 and later; 8, 1, 4, 8192 for Llama 3.1).
struct RopeScaling {
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
};
// inv_freq (D/2): theta^(-2i/D), as transformers' fp32 computation (each of its steps rounded to fp32 here too),
// then Llama 3's scaling when `scaling` is given (null: rope_type "default", as Qwen 2.5, SmolLM2 and Mistral).
void rope_frequencies(float* inv_freq, int D, float theta, const RopeScaling* scaling);
// Rotary embedding of inp (B,T,NH,D) at positions 0..T-1, in transformers' "rotate_half" layout: element i pairs
// with i + D/2 (not with i+1), rotated by the angle t * inv_freq[i]: out_i = x_i cos - x_{i+D/2} sin,
// out_{i+D/2} = x_{i+D/2} cos + x_i sin. The angle and its cos and sin are rounded to fp32 as transformers
// rounds them (rounding moves an angle near 8192 rad by up to 2.4e-4 rad), the rotation is computed in double;
// out may be inp. rope_backward applies the inverse rotation to dout.
void rope_forward(float* out, const float* inp, const float* inv_freq, int B, int T, int NH, int D);
void rope_backward(float* dinp, const float* dout, const float* inv_freq, int B, int T, int NH, int D);

// SwiGLU: inp rows (N, 2F) are [gate (F) | up (F)]; out (N,F) = silu(gate) * up, silu(x) = x sigmoid(x).
void swiglu_forward(float* out, const float* inp, int N, int F);
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);

struct Config {
    int max_seq_len, vocab_size, padded_vocab_size, num_layers, num_heads, channels;
};

// params/grads/m/v in model-file (llm.c) order; activations are sized on a forward for its B,T (resized when
// B,T change).
struct Model;

Model* model_load(const char* path);  // llm.c model file v3 or v5; one-line error + exit(1) on bad input
void model_free(Model*);
const Config& model_config(const Model*);
size_t model_num_params(const Model*);
float* model_params(Model*);
float* model_grads(Model*);
// Returns the mean loss over the counted targets when targets are given (else 0).
float model_forward(Model*, const int* inputs, const int* targets, int B, int T);
const float* model_logits(const Model*);  // (B,T,Vp) of the last forward
void model_zero_grad(Model*);
void model_backward(Model*);  // after a forward with targets; accumulates into the parameter gradients
// Clips the gradients in place by global norm (scale clip/norm when norm > clip, as llm.c), then AdamW with weight
// decay only on the 2+-dim tensors (wte, wpe, qkvw, attprojw, fcw, fcprojw). Returns the norm before clipping.
// With LoRA on: the same over the adapter gradients only, and every adapter tensor gets the weight decay (A and B
// are 2-D); the base parameters are not touched.
float model_update(Model*, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int t);

// ---- LoRA (Hu et al. 2021; adapter file format: docs/lora.md)
// Each targeted Linear W0 (out, in) computes W0 x + b + (alpha/r) B (A x), A (r, in), B (out, r), the scale
// alpha/r in fp32. With LoRA on the 16 base tensors are frozen: model_backward passes activation gradients through
// them but computes no parameter gradient (model_grads stays zero; only the adapters get gradients). Adapter
// parameters, gradients and moments are flat arrays in adapter-file order: per layer, per target in the order
// qkv, attn-proj, fc, fc-proj (those in the bitmask), A then B. No adapter dropout here (p = 0).
constexpr unsigned kLoraQkv = 1, kLoraAttnProj = 2, kLoraFc = 4, kLoraFcProj = 8;  // the target bits
struct LoraConfig {
    int rank;
    float alpha;
    unsigned targets;  // bitmask of kLora*
};

// Turns LoRA on (or reconfigures it: fresh adapters, zero gradients and moments): B = 0, A uniform in
// +-1/sqrt(in) (PyTorch's default nn.Linear init, Kaiming-uniform with a = sqrt(5)) from a generator seeded with
// `seed` (not PyTorch's random stream: tests that compare with PyTorch load its adapter file instead).
// A bad config or merged adapters (lora_merge) is a one-line error and exit(1).
void model_enable_lora(Model*, const LoraConfig&, unsigned seed);
const LoraConfig* model_lora(const Model*);  // null while LoRA is off
size_t model_lora_num_params(const Model*);
float* model_lora_params(Model*);
float* model_lora_grads(Model*);
// Adapter files. lora_load validates the file against the model and turns LoRA on with the file's configuration and
// tensors (gradients and moments zero); on bad input it returns false with a one-line "PATH: what" in *error and
// leaves the model unchanged. lora_save writes to PATH.tmp and renames it.
bool lora_load(Model*, const char* path, std::string* error);
bool lora_save(const Model*, const char* path, std::string* error);
// lora_merge adds (alpha/r) B A to every targeted base weight (summed in double, rounded once to fp32), after which
// the model computes without its adapters; lora_unmerge subtracts the same product again, restoring W0 to within
// fp32 rounding, and the adapters apply again. model_backward is an error while merged.
void lora_merge(Model*);
void lora_unmerge(Model*);

}  // namespace cpuref
