// Plain C++17 fp32 CPU reference of GPT-2 forward, backward and AdamW: the ground truth for GPU kernel tests.
//
// Conventions (as llm.c's train_gpt2.c):
// - N is the number of rows, B*T. Tensors are row-major; Linear weights are (out, in): y = x W^T + b.
// - Every backward function ACCUMULATES (+=) into all of its gradient outputs, dinp included.
// - Long reductions are accumulated in double so results match PyTorch's fp32 to ~1e-6 relative.
// - Parameters, gradients and optimizer state of a Model are flat arrays in model-file (llm.c) order
//   (docs/formats.md).
#pragma once

#include <cstddef>

namespace cpuref {

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C);

// eps 1e-5, biased variance; mean and rstd are (N).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] * weight[OC,C]^T + bias; bias/dbias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// qkv (B,T,3C) with q, k, v each (C) per row and head h in columns h*hs..h*hs+hs-1; preatt, att (B,NH,T,T);
// out (B,T,C). Scale 1/sqrt(hs), causal. Masked entries (key t2 > query t) of preatt and att are set to 0,
// and the backward leaves the masked entries of dpreatt and datt untouched.
void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

// tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int N);
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);

void residual_forward(float* out, const float* a, const float* b, int N);
void residual_backward(float* da, float* db, const float* dout, int N);

// logits rows have stride Vp; only the first V columns are real. probs gets the softmax over V columns
// (padded columns 0); losses (N) = -log p(target).
void softmax_crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, int N, int V,
                                  int Vp);
// dlogits (+=) = (probs - onehot(target)) * dloss_per_row; padded columns untouched.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss_per_row, int N,
                                   int V, int Vp);

// docs/formats.md AdamW, t = 1-based step: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr (mhat / (sqrt(vhat) + eps) + wd p).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t);
double global_norm(const float* grad, size_t n);

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
// Returns the mean loss when targets are given (else 0).
float model_forward(Model*, const int* inputs, const int* targets, int B, int T);
const float* model_logits(const Model*);  // (B,T,Vp) of the last forward
void model_zero_grad(Model*);
void model_backward(Model*);  // after a forward with targets; accumulates into the parameter gradients
// Clips the gradients in place by global norm (scale clip/norm when norm > clip, as llm.c), then AdamW with weight
// decay only on the 2+-dim tensors (wte, wpe, qkvw, attprojw, fcw, fcprojw). Returns the norm before clipping.
float model_update(Model*, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip, int t);

}  // namespace cpuref
