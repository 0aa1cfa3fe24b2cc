// Plain C++17 fp32 CPU reference of GPT-2 (see cpu_reference.h for the conventions).
#include "cpu_reference.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace cpuref {

namespace {

constexpr int kModelMagic = 20240326;
constexpr int kHeaderInts = 256;
constexpr double kLnEps = 1e-5;
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)

// Dot product of two float vectors, accumulated in double (vectorised by the simd reduction).
double dot(const float* a, const float* b, int n) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += (double)a[i] * (double)b[i];
    return sum;
}

}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            const float* we = wte + (size_t)inp[b * T + t] * C;
            const float* pe = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float* d = dout + ((size_t)b * T + t) * C;
            float* dwe = dwte + (size_t)inp[b * T + t] * C;
            float* dpe = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                dwe[c] += d[c];
                dpe[c] += d[c];
            }
        }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        double m = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        double var = 0.0;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        double s = 1.0 / std::sqrt(var + kLnEps);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (float)((x[c] - m) * s * weight[c] + bias[c]);
        mean[n] = (float)m;
        rstd[n] = (float)s;
    }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
    std::vector<double> dw(C, 0.0), db(C, 0.0);
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        const double m = mean[n], s = rstd[n];
        // dx = s * (w*dy - mean(w*dy) - xhat * mean(w*dy*xhat))
        double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
        for (int c = 0; c < C; c++) {
            double dnorm = (double)weight[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[c] - m) * s;
            db[c] += d[c];
            dw[c] += xhat * d[c];
            dx[c] += (float)(s * ((double)weight[c] * d[c] - dnorm_mean - xhat * dnorm_norm_mean));
        }
    }
    for (int c = 0; c < C; c++) {
        if (dweight) dweight[c] += (float)dw[c];
        if (dbias) dbias[c] += (float)db[c];
    }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) {
    // Tiles of output columns so a tile of weight rows stays in cache while all N input rows stream past it
    // (the LM head's weight is far larger than the cache).
    constexpr int kTile = 64;
#pragma omp parallel for schedule(dynamic)
    for (int o0 = 0; o0 < OC; o0 += kTile) {
        const int o1 = std::min(OC, o0 + kTile);
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            float* y = out + (size_t)n * OC;
            for (int o = o0; o < o1; o++)
                y[o] = (float)((bias ? (double)bias[o] : 0.0) + dot(x, weight + (size_t)o * C, C));
        }
    }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
    constexpr int kTile = 16;
    // dinp[n,:] += sum_o dout[n,o] weight[o,:], for a tile of rows at a time so each weight row is read once
    // per tile; double accumulators because OC can be the vocabulary (50k terms).
#pragma omp parallel for schedule(dynamic)
    for (int n0 = 0; n0 < N; n0 += kTile) {
        const int rows = std::min(N, n0 + kTile) - n0;
        std::vector<double> acc((size_t)rows * C, 0.0);
        for (int o = 0; o < OC; o++) {
            const float* w = weight + (size_t)o * C;
            for (int i = 0; i < rows; i++) {
                const double d = dout[(size_t)(n0 + i) * OC + o];
                double* a = acc.data() + (size_t)i * C;
#pragma omp simd
                for (int c = 0; c < C; c++) a[c] += d * w[c];
            }
        }
        for (int i = 0; i < rows; i++)
            for (int c = 0; c < C; c++) dinp[(size_t)(n0 + i) * C + c] += (float)acc[(size_t)i * C + c];
    }
    if (!dweight && !dbias) return;  // frozen weight
    // dweight[o,:] += sum_n dout[n,o] inp[n,:] and dbias[o] += sum_n dout[n,o], for a tile of outputs at a time
    // so every cache line of dout is used fully.
#pragma omp parallel for schedule(dynamic)
    for (int o0 = 0; o0 < OC; o0 += kTile) {
        const int cols = std::min(OC, o0 + kTile) - o0;
        std::vector<double> acc((size_t)cols * C, 0.0), bacc(cols, 0.0);
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            for (int j = 0; j < cols; j++) {
                const double d = dout[(size_t)n * OC + o0 + j];
                bacc[j] += d;
                double* a = acc.data() + (size_t)j * C;
#pragma omp simd
                for (int c = 0; c < C; c++) a[c] += d * x[c];
            }
        }
        for (int j = 0; j < cols; j++) {
            if (dweight)
                for (int c = 0; c < C; c++) dweight[(size_t)(o0 + j) * C + c] += (float)acc[(size_t)j * C + c];
            if (dbias) dbias[o0 + j] += (float)bacc[j];
        }
    }
}

void gqa_attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int NH, int KVH,
                           int D) {
    const size_t row = (size_t)(NH + 2 * KVH) * D;
    const int group = NH / KVH;  // query heads per kv head
    const double scale = 1.0 / std::sqrt((double)D);
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + ((size_t)b * T + t) * row + (size_t)h * D;
                const size_t k_col = (size_t)(NH + h / group) * D, v_col = (size_t)(NH + KVH + h / group) * D;
                float* pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * row + k_col;
                    pre[t2] = (float)(dot(q, k, D) * scale);
                    maxval = std::max(maxval, pre[t2]);
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) sum += std::exp((double)pre[t2] - maxval);
                for (int t2 = 0; t2 <= t; t2++) a[t2] = (float)(std::exp((double)pre[t2] - maxval) / sum);
                for (int t2 = t + 1; t2 < T; t2++) pre[t2] = a[t2] = 0.0f;
                float* o = out + ((size_t)b * T + t) * NH * D + (size_t)h * D;
                for (int i = 0; i < D; i++) {
                    double acc = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) acc += (double)a[t2] * qkv[((size_t)b * T + t2) * row + v_col + i];
                    o[i] = (float)acc;
                }
            }
}

void gqa_attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                            const float* att, int B, int T, int NH, int KVH, int D) {
    const size_t row = (size_t)(NH + 2 * KVH) * D;
    const int group = NH / KVH;
    const double scale = 1.0 / std::sqrt((double)D);
    // One task per (b, kv head): the rows t2 of k and v receive gradient from every query t >= t2 of every query
    // head of the group, so parallelising over t or over query heads would race. Gradients of q, k, v are
    // accumulated in double and added once at the end.
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int kvh = 0; kvh < KVH; kvh++) {
            const size_t k_col = (size_t)(NH + kvh) * D, v_col = (size_t)(NH + KVH + kvh) * D;
            auto row_at = [&](int t) { return qkv + ((size_t)b * T + t) * row; };
            std::vector<double> dq((size_t)T * D), dk((size_t)T * D, 0.0), dv((size_t)T * D, 0.0);
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                std::fill(dq.begin(), dq.end(), 0.0);
                for (int t = 0; t < T; t++) {
                    const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                    float* da = datt + (((size_t)b * NH + h) * T + t) * T;
                    float* dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                    const float* d = dout + ((size_t)b * T + t) * NH * D + (size_t)h * D;
                    // out = sum_t2 att[t2] v[t2]
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float* v = row_at(t2) + v_col;
                        da[t2] += (float)dot(v, d, D);
                        for (int i = 0; i < D; i++) dv[(size_t)t2 * D + i] += (double)a[t2] * d[i];
                    }
                    // softmax: dpre[t2] = att[t2] (datt[t2] - sum_t3 att[t3] datt[t3])
                    double weighted = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) weighted += (double)a[t2] * da[t2];
                    for (int t2 = 0; t2 <= t; t2++) dpre[t2] += (float)((double)a[t2] * (da[t2] - weighted));
                    // preatt = scale * q . k
                    const float* q = row_at(t) + (size_t)h * D;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float* k = row_at(t2) + k_col;
                        const double g = scale * dpre[t2];
                        for (int i = 0; i < D; i++) {
                            dq[(size_t)t * D + i] += g * k[i];
                            dk[(size_t)t2 * D + i] += g * q[i];
                        }
                    }
                }
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < D; i++)
                        dqkv[((size_t)b * T + t) * row + (size_t)h * D + i] += (float)dq[(size_t)t * D + i];
            }
            for (int t = 0; t < T; t++) {
                float* dst = dqkv + ((size_t)b * T + t) * row;
                for (int i = 0; i < D; i++) {
                    dst[k_col + i] += (float)dk[(size_t)t * D + i];
                    dst[v_col + i] += (float)dv[(size_t)t * D + i];
                }
            }
        }
}

void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH) {
    gqa_attention_forward(out, preatt, att, qkv, B, T, NH, NH, C / NH);
}

void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
    gqa_attention_backward(dqkv, dpreatt, datt, dout, qkv, att, B, T, NH, NH, C / NH);
}

void gelu_forward(float* out, const float* inp, int N) {
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const double x = inp[i];
        out[i] = (float)(0.5 * x * (1.0 + std::tanh(kGeluScale * (x + 0.044715 * x * x * x))));
    }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
#pragma omp parallel for
    for (int i = 0; i < N; i++) {
        const double x = inp[i];
        const double th = std::tanh(kGeluScale * (x + 0.044715 * x * x * x));
        const double sech2 = 1.0 - th * th;
        const double grad = 0.5 * (1.0 + th) + 0.5 * x * sech2 * kGeluScale * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] += (float)(grad * dout[i]);
    }
}

void residual_forward(float* out, const float* a, const float* b, int N) {
    for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, int N) {
    for (int i = 0; i < N; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

int counted_targets(const int* targets, int N) {
    int counted = 0;
    for (int i = 0; i < N; i++) counted += targets[i] != kIgnoredTarget;
    return counted;
}

void softmax_crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, int N, int V,
                                  int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = logits + (size_t)n * Vp;
        float* p = probs + (size_t)n * Vp;
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) maxval = std::max(maxval, x[v]);
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += std::exp((double)x[v] - maxval);
        for (int v = 0; v < V; v++) p[v] = (float)(std::exp((double)x[v] - maxval) / sum);
        for (int v = V; v < Vp; v++) p[v] = 0.0f;
        // log-sum-exp form: more accurate than -log(p[target]) in float
        losses[n] = targets[n] == kIgnoredTarget ? 0.0f : (float)(std::log(sum) + maxval - x[targets[n]]);
    }
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss_per_row, int N,
                                   int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * Vp;
        float* d = dlogits + (size_t)n * Vp;
        if (targets[n] == kIgnoredTarget) continue;
        for (int v = 0; v < V; v++) d[v] += (p[v] - (v == targets[n] ? 1.0f : 0.0f)) * dloss_per_row;
    }
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t) {
    const float bias1 = (float)(1.0 - std::pow((double)beta1, t));
    const float bias2 = (float)(1.0 - std::pow((double)beta2, t));
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * (g * g);
        const float mhat = m[i] / bias1;
        const float vhat = v[i] / bias2;
        param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    }
}

double global_norm(const float* grad, size_t n) {
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum)
    for (size_t i = 0; i < n; i++) sum += (double)grad[i] * grad[i];
    return std::sqrt(sum);
}

// ------------------------------------------------------------------------------------------------------------
// Llama family layers

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const double s = 1.0 / std::sqrt(dot(x, x, C) / C + eps);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (float)(x[c] * s * weight[c]);
        rstd[n] = (float)s;
    }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
    std::vector<double> dw(C, 0.0);
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        const double s = rstd[n];
        // dx = s * (w*dy - xhat * mean(w*dy*xhat)), xhat = x*s: LayerNorm's without the mean terms
        double dnorm_norm_mean = 0.0;
        for (int c = 0; c < C; c++) dnorm_norm_mean += (double)weight[c] * d[c] * x[c] * s;
        dnorm_norm_mean /= C;
        float* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            const double xhat = x[c] * s;
            dw[c] += xhat * d[c];
            dx[c] += (float)(s * ((double)weight[c] * d[c] - xhat * dnorm_norm_mean));
        }
    }
    if (dweight)
        for (int c = 0; c < C; c++) dweight[c] += (float)dw[c];
}

void rope_frequencies(float* inv_freq, int D, float theta, const RopeScaling* scaling) {
    constexpr double kTwoPi = 6.283185307179586;
    for (int i = 0; i < D / 2; i++) {
        // transformers' fp32 steps, each rounded to fp32: 2i/D, theta to that power, its reciprocal
        const float exponent = (float)(2 * i) / (float)D;
        const float power = (float)std::pow((double)theta, (double)exponent);
        float f = 1.0f / power;
        if (scaling) {
            // rope_type llama3: wavelengths above original/low_freq_factor are stretched by `factor`, those below
            // original/high_freq_factor kept, and those between interpolated smoothly between the two
            const double original = scaling->original_max_position_embeddings;
            const double low = scaling->low_freq_factor, high = scaling->high_freq_factor;
            const double wavelen = kTwoPi / f;
            if (wavelen > original / low) {
                f = (float)(f / (double)scaling->factor);
            } else if (wavelen >= original / high) {
                const double smooth = (original / wavelen - low) / (high - low);
                f = (float)((1.0 - smooth) * f / scaling->factor + smooth * f);
            }
        }
        inv_freq[i] = f;
    }
}

namespace {

// cos and sin of the rotation at `position` for one inverse frequency, as transformers makes them: the angle is
// the fp32 product position * inv_freq, and its cos and sin are rounded to fp32 (here evaluated in double, which
// torch's fp32 cos and sin match to within about an ulp). The fp32 angle matters at long positions: rounding
// moves an angle near 8192 rad by up to 2.4e-4 rad.
void rope_cos_sin(int position, float inv_freq, double* c, double* s) {
    const float angle = (float)position * inv_freq;
    *c = (float)std::cos((double)angle);
    *s = (float)std::sin((double)angle);
}

}  // namespace

void rope_forward(float* out, const float* inp, const float* inv_freq, int B, int T, int NH, int D) {
    const int half = D / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                double c, s;
                rope_cos_sin(t, inv_freq[i], &c, &s);
                for (int h = 0; h < NH; h++) {
                    const size_t at = (((size_t)b * T + t) * NH + h) * D + i;
                    // both read before either is written, so out may be inp
                    const double x1 = inp[at], x2 = inp[at + half];
                    out[at] = (float)(x1 * c - x2 * s);
                    out[at + half] = (float)(x2 * c + x1 * s);
                }
            }
}

void rope_backward(float* dinp, const float* dout, const float* inv_freq, int B, int T, int NH, int D) {
    const int half = D / 2;
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                double c, s;
                rope_cos_sin(t, inv_freq[i], &c, &s);
                for (int h = 0; h < NH; h++) {
                    const size_t at = (((size_t)b * T + t) * NH + h) * D + i;
                    // the transposed rotation, which is its inverse
                    const double d1 = dout[at], d2 = dout[at + half];
                    dinp[at] += (float)(d1 * c + d2 * s);
                    dinp[at + half] += (float)(d2 * c - d1 * s);
                }
            }
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            const double gate = inp[(size_t)n * 2 * F + i], up = inp[(size_t)n * 2 * F + F + i];
            out[(size_t)n * F + i] = (float)(gate / (1.0 + std::exp(-gate)) * up);
        }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            const size_t g = (size_t)n * 2 * F + i, u = g + F;
            const double gate = inp[g], up = inp[u], d = dout[(size_t)n * F + i];
            const double sig = 1.0 / (1.0 + std::exp(-gate));
            // silu'(x) = sig(x) (1 + x (1 - sig(x)))
            dinp[g] += (float)(d * up * sig * (1.0 + gate * (1.0 - sig)));
            dinp[u] += (float)(d * gate * sig);
        }
}

// ------------------------------------------------------------------------------------------------------------
// Model

namespace {

constexpr int kNumTensors = 16;
// Model-file order; kDecay marks the tensors that get weight decay.
enum Tensor { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
constexpr bool kDecay[kNumTensors] = {true, true, false, false, true, false, true, false,
                                      false, false, true, false, true, false, false, false};

void tensor_sizes(const Config& c, size_t sizes[kNumTensors]) {
    const size_t Vp = c.padded_vocab_size, C = c.channels, L = c.num_layers, T = c.max_seq_len;
    const size_t s[kNumTensors] = {Vp * C, T * C,     L * C,     L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                   L * C,  L * C,     L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    std::copy(s, s + kNumTensors, sizes);
}

// Pointers to the 16 tensors inside one flat buffer (parameters or gradients).
struct Tensors {
    float* t[kNumTensors];
    Tensors(float* base, const size_t sizes[kNumTensors]) {
        for (int i = 0; i < kNumTensors; i++) {
            t[i] = base;
            base += sizes[i];
        }
    }
    float* operator[](int i) const { return t[i]; }
};

// Activations (and, with the same shapes, their gradients) for one B,T.
struct Acts {
    std::vector<float> encoded, ln1, ln1_mean, ln1_rstd, qkv, atty, preatt, att, attproj, residual2, ln2, ln2_mean,
        ln2_rstd, fch, fch_gelu, fcproj, residual3, lnf, lnf_mean, lnf_rstd, logits, probs, losses;

    void resize(const Config& c, int B, int T) {
        const size_t N = (size_t)B * T, C = c.channels, L = c.num_layers, NH = c.num_heads;
        encoded.assign(N * C, 0.0f);
        for (auto* v : {&ln1, &atty, &attproj, &residual2, &ln2, &fcproj, &residual3}) v->assign(L * N * C, 0.0f);
        for (auto* v : {&ln1_mean, &ln1_rstd, &ln2_mean, &ln2_rstd}) v->assign(L * N, 0.0f);
        qkv.assign(L * N * 3 * C, 0.0f);
        preatt.assign(L * B * NH * T * T, 0.0f);
        att.assign(L * B * NH * T * T, 0.0f);
        fch.assign(L * N * 4 * C, 0.0f);
        fch_gelu.assign(L * N * 4 * C, 0.0f);
        lnf.assign(N * C, 0.0f);
        lnf_mean.assign(N, 0.0f);
        lnf_rstd.assign(N, 0.0f);
        logits.assign(N * c.padded_vocab_size, 0.0f);
        probs.assign(N * c.padded_vocab_size, 0.0f);
        losses.assign(N, 0.0f);
    }

    void zero() {
        for (auto* v : {&encoded, &ln1, &ln1_mean, &ln1_rstd, &qkv, &atty, &preatt, &att, &attproj, &residual2, &ln2,
                        &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &fcproj, &residual3, &lnf, &lnf_mean, &lnf_rstd,
                        &logits, &probs, &losses})
            std::fill(v->begin(), v->end(), 0.0f);
    }
};

[[noreturn]] void die(const char* path, const char* what) {
    std::fprintf(stderr, "cpuref: %s: %s\n", path, what);
    std::exit(1);
}

// Scales grads by clip/norm when their global norm exceeds clip (> 0), as llm.c. Returns the norm before.
double clip_by_global_norm(std::vector<float>& grads, float grad_clip) {
    const double norm = global_norm(grads.data(), grads.size());
    if (grad_clip > 0.0f && norm > grad_clip) {
        const float scale = (float)(grad_clip / norm);
        for (float& g : grads) g *= scale;
    }
    return norm;
}

// printf into a std::string, for the short one-line messages below.
template <typename... Args>
std::string strprintf(const char* fmt, Args... args) {
    char buf[256];
    std::snprintf(buf, sizeof buf, fmt, args...);
    return buf;
}

// ---- LoRA state

constexpr int kLoraMagic = 20261127;
constexpr int kLoraVersion = 1;
constexpr int kLoraNumTargets = 4;
// The targets in adapter-file order (lora_forward and lora_backward take the index): bit, adapted weight, and that
// weight's (in, out) features in units of C.
enum LoraTargetIndex { QKV_TARGET, ATTN_PROJ_TARGET, FC_TARGET, FC_PROJ_TARGET };
struct LoraTargetInfo {
    unsigned bit;
    int weight, in_mult, out_mult;
};
constexpr LoraTargetInfo kLoraTargets[kLoraNumTargets] = {
    {kLoraQkv, QKVW, 1, 3}, {kLoraAttnProj, ATTPROJW, 1, 1}, {kLoraFc, FCW, 1, 4}, {kLoraFcProj, FCPROJW, 4, 1}};

// The message for an invalid configuration, or "" (targets is wide so that a negative file word is shown as is).
std::string lora_config_error(int rank, float alpha, long long targets) {
    if (rank <= 0) return strprintf("adapter rank %d must be positive", rank);
    if (!std::isfinite(alpha) || alpha <= 0.0f) return strprintf("adapter alpha %g must be finite and positive", alpha);
    if (targets < 1 || targets > 15)
        return strprintf("bad adapter target bitmask %lld (expected 1..15: 1 qkv, 2 attn-proj, 4 fc, 8 fc-proj)",
                         targets);
    return "";
}

// One adapter: A (r, in) at offset a and B (out, r) at offset b of the adapter arrays, for `weight` of `layer`.
struct LoraSlot {
    int layer, weight, in, out;
    size_t a, b;
};

struct LoraState {
    LoraConfig cfg;
    float scale;  // alpha / r
    bool merged = false;
    std::vector<LoraSlot> slots;  // adapter-file order
    std::vector<int> slot_of;     // layer * kLoraNumTargets + target index -> index into slots, or -1
    std::vector<float> params, grads, m, v;
    // For the N rows of the last forward: A x of every slot ((N, r) each, slot after slot) for the backward, and
    // scratch for B (A x) or its gradient (N, out) and the gradient of A x (N, r).
    std::vector<float> ax, scratch_out, scratch_r;

    LoraState(const Config& c, const LoraConfig& lc)
        : cfg(lc), scale(lc.alpha / (float)lc.rank), slot_of((size_t)c.num_layers * kLoraNumTargets, -1) {
        size_t offset = 0;
        for (int l = 0; l < c.num_layers; l++)
            for (int t = 0; t < kLoraNumTargets; t++) {
                const LoraTargetInfo& info = kLoraTargets[t];
                if (!(lc.targets & info.bit)) continue;
                const int in = info.in_mult * c.channels, out = info.out_mult * c.channels;
                const size_t a = offset, b = a + (size_t)lc.rank * in;
                offset = b + (size_t)out * lc.rank;
                slot_of[(size_t)l * kLoraNumTargets + t] = (int)slots.size();
                slots.push_back({l, info.weight, in, out, a, b});
            }
        for (auto* v : {&params, &grads, &m, &v}) v->assign(offset, 0.0f);
    }

    void resize(const Config& c, int N) {
        ax.resize(slots.size() * N * cfg.rank);
        scratch_out.resize((size_t)N * 4 * c.channels);
        scratch_r.resize((size_t)N * cfg.rank);
    }
};

// y (N, out) += (alpha/r) B (A x) for the adapter of (layer, target), keeping A x for the backward. Nothing without
// LoRA, while merged, or for a weight without an adapter.
void lora_forward(LoraState* s, int layer, int target, float* y, const float* x, int N) {
    if (!s || s->merged) return;
    const int k = s->slot_of[(size_t)layer * kLoraNumTargets + target];
    if (k < 0) return;
    const LoraSlot& slot = s->slots[k];
    const int r = s->cfg.rank;
    float* ax = s->ax.data() + (size_t)k * N * r;
    float* bax = s->scratch_out.data();
    matmul_forward(ax, x, s->params.data() + slot.a, nullptr, N, slot.in, r);
    matmul_forward(bax, ax, s->params.data() + slot.b, nullptr, N, r, slot.out);
    // Added to the rounded base output, as PyTorch adds the two branches: with B = 0, y stays bitwise the same.
    for (size_t i = 0; i < (size_t)N * slot.out; i++) y[i] += s->scale * bax[i];
}

// The adapter's share of the backward of a targeted matmul, given its output gradient dy: dA and dB (+=), and
// dx (+=) through the adapter (the base matmul's backward adds the share through W0).
void lora_backward(LoraState* s, int layer, int target, float* dx, const float* dy, const float* x, int N) {
    if (!s) return;
    const int k = s->slot_of[(size_t)layer * kLoraNumTargets + target];
    if (k < 0) return;
    const LoraSlot& slot = s->slots[k];
    const int r = s->cfg.rank;
    const float* ax = s->ax.data() + (size_t)k * N * r;
    float* dbax = s->scratch_out.data();
    float* dax = s->scratch_r.data();
    for (size_t i = 0; i < (size_t)N * slot.out; i++) dbax[i] = s->scale * dy[i];
    std::fill(s->scratch_r.begin(), s->scratch_r.end(), 0.0f);
    matmul_backward(dax, s->grads.data() + slot.b, nullptr, dbax, ax, s->params.data() + slot.b, N, r, slot.out);
    matmul_backward(dx, s->grads.data() + slot.a, nullptr, dax, x, s->params.data() + slot.a, N, slot.in, r);
}

}  // namespace

struct Model {
    Config cfg{};
    size_t sizes[kNumTensors]{};
    size_t num_params = 0;
    std::vector<float> params, grads, m, v;
    int B = 0, T = 0;
    Acts acts, dacts;
    std::vector<int> inputs, targets;  // targets empty after a forward without targets
    std::unique_ptr<LoraState> lora;   // null while LoRA is off
};

Model* model_load(const char* path) {
    FILE* f = std::fopen(path, "rb");
    if (!f) die(path, "cannot open model file");
    int header[kHeaderInts];
    if (std::fread(header, sizeof(int), kHeaderInts, f) != (size_t)kHeaderInts) die(path, "truncated model header");
    char msg[160];
    if (header[0] != kModelMagic) {
        std::snprintf(msg, sizeof msg, "bad model magic %d (expected %d)", header[0], kModelMagic);
        die(path, msg);
    }
    const int version = header[1];
    if (version != 3 && version != 5) {
        std::snprintf(msg, sizeof msg, "unsupported model version %d (expected 3 or 5)", version);
        die(path, msg);
    }
    Model* model = new Model;
    Config& c = model->cfg;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 ||
        c.channels % c.num_heads != 0 || c.padded_vocab_size < c.vocab_size)
        die(path, "invalid model dimensions in header");
    tensor_sizes(c, model->sizes);
    for (size_t s : model->sizes) model->num_params += s;
    const size_t P = model->num_params, elem = version == 3 ? 4 : 2;
    std::fseek(f, 0, SEEK_END);
    const long file_size = std::ftell(f);
    if (file_size != (long)(sizeof(header) + P * elem)) {
        std::snprintf(msg, sizeof msg, "file size %ld != %zu expected from its header", file_size,
                      sizeof(header) + P * elem);
        die(path, msg);
    }
    std::fseek(f, sizeof(header), SEEK_SET);
    model->params.resize(P);
    if (version == 3) {
        if (std::fread(model->params.data(), 4, P, f) != P) die(path, "truncated tensors");
    } else {
        std::vector<uint16_t> raw(P);
        if (std::fread(raw.data(), 2, P, f) != P) die(path, "truncated tensors");
        for (size_t i = 0; i < P; i++) {  // bf16 is the top half of an fp32
            const uint32_t bits = (uint32_t)raw[i] << 16;
            std::memcpy(&model->params[i], &bits, 4);
        }
    }
    std::fclose(f);
    model->grads.assign(P, 0.0f);
    model->m.assign(P, 0.0f);
    model->v.assign(P, 0.0f);
    return model;
}

void model_free(Model* model) { delete model; }
const Config& model_config(const Model* model) { return model->cfg; }
size_t model_num_params(const Model* model) { return model->num_params; }
float* model_params(Model* model) { return model->params.data(); }
float* model_grads(Model* model) { return model->grads.data(); }
const float* model_logits(const Model* model) { return model->acts.logits.data(); }
void model_zero_grad(Model* model) {
    std::fill(model->grads.begin(), model->grads.end(), 0.0f);
    if (model->lora) std::fill(model->lora->grads.begin(), model->lora->grads.end(), 0.0f);
}

float model_forward(Model* model, const int* inputs, const int* targets, int B, int T) {
    const Config& c = model->cfg;
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, V = c.vocab_size, Vp = c.padded_vocab_size;
    const int N = B * T;
    if (B <= 0 || T <= 0 || T > c.max_seq_len) {
        std::fprintf(stderr, "cpuref: model_forward: bad B=%d T=%d (max seq len %d)\n", B, T, c.max_seq_len);
        std::exit(1);
    }
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < kIgnoredTarget || targets[i] >= V))) {
            std::fprintf(stderr, "cpuref: model_forward: token out of range [0, %d) at %d\n", V, i);
            std::exit(1);
        }
    if (B != model->B || T != model->T) {
        model->acts.resize(c, B, T);
        model->dacts.resize(c, B, T);
        model->B = B;
        model->T = T;
    }
    LoraState* lora = model->lora.get();
    if (lora) lora->resize(c, N);
    model->inputs.assign(inputs, inputs + N);
    if (targets)
        model->targets.assign(targets, targets + N);
    else
        model->targets.clear();

    const Tensors p(model->params.data(), model->sizes);
    Acts& a = model->acts;
    const size_t NC = (size_t)N * C;
    encoder_forward(a.encoded.data(), inputs, p[WTE], p[WPE], B, T, C);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NC;
        float* ln1 = a.ln1.data() + l * NC;
        float* qkv = a.qkv.data() + l * 3 * NC;
        float* atty = a.atty.data() + l * NC;
        float* attproj = a.attproj.data() + l * NC;
        float* residual2 = a.residual2.data() + l * NC;
        float* ln2 = a.ln2.data() + l * NC;
        float* fch = a.fch.data() + l * 4 * NC;
        float* fch_gelu = a.fch_gelu.data() + l * 4 * NC;
        float* fcproj = a.fcproj.data() + l * NC;
        const size_t att_size = (size_t)B * NH * T * T;
        layernorm_forward(ln1, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, residual, p[LN1W] + l * C,
                          p[LN1B] + l * C, N, C);
        matmul_forward(qkv, ln1, p[QKVW] + (size_t)l * 3 * C * C, p[QKVB] + l * 3 * C, N, C, 3 * C);
        lora_forward(lora, l, QKV_TARGET, qkv, ln1, N);
        attention_forward(atty, a.preatt.data() + l * att_size, a.att.data() + l * att_size, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, p[ATTPROJW] + (size_t)l * C * C, p[ATTPROJB] + l * C, N, C, C);
        lora_forward(lora, l, ATTN_PROJ_TARGET, attproj, atty, N);
        residual_forward(residual2, residual, attproj, (int)NC);
        layernorm_forward(ln2, a.ln2_mean.data() + l * N, a.ln2_rstd.data() + l * N, residual2, p[LN2W] + l * C,
                          p[LN2B] + l * C, N, C);
        matmul_forward(fch, ln2, p[FCW] + (size_t)l * 4 * C * C, p[FCB] + l * 4 * C, N, C, 4 * C);
        lora_forward(lora, l, FC_TARGET, fch, ln2, N);
        gelu_forward(fch_gelu, fch, (int)(4 * NC));
        matmul_forward(fcproj, fch_gelu, p[FCPROJW] + (size_t)l * 4 * C * C, p[FCPROJB] + l * C, N, 4 * C, C);
        lora_forward(lora, l, FC_PROJ_TARGET, fcproj, fch_gelu, N);
        residual_forward(a.residual3.data() + l * NC, residual2, fcproj, (int)NC);
    }
    layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), a.residual3.data() + (L - 1) * NC,
                      p[LNFW], p[LNFB], N, C);
    // LM head over all Vp rows of wte; the padded rows are zero so their logits are too, and the loss never
    // reads them.
    matmul_forward(a.logits.data(), a.lnf.data(), p[WTE], nullptr, N, C, Vp);
    if (!targets) return 0.0f;
    softmax_crossentropy_forward(a.probs.data(), a.losses.data(), a.logits.data(), targets, N, V, Vp);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += a.losses[i];
    return (float)(sum / counted_targets(targets, N));
}

void model_backward(Model* model) {
    if (model->targets.empty()) {
        std::fprintf(stderr, "cpuref: model_backward needs a preceding forward with targets\n");
        std::exit(1);
    }
    LoraState* lora = model->lora.get();
    if (lora && lora->merged) die("model_backward", "the LoRA adapters are merged (lora_unmerge first)");
    const Config& c = model->cfg;
    const int B = model->B, T = model->T, N = B * T;
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, V = c.vocab_size, Vp = c.padded_vocab_size;
    const size_t NC = (size_t)N * C, att_size = (size_t)B * NH * T * T;
    const Tensors p(model->params.data(), model->sizes);
    const Tensors g(model->grads.data(), model->sizes);
    // With LoRA the base parameters are frozen: a null gradient makes the kernels skip the weight products.
    auto grad = [&](int tensor, size_t offset) -> float* { return lora ? nullptr : g[tensor] + offset; };
    const Acts& a = model->acts;
    Acts& d = model->dacts;
    d.zero();  // the kernels accumulate

    softmax_crossentropy_backward(d.logits.data(), a.probs.data(), model->targets.data(),
                                  1.0f / counted_targets(model->targets.data(), N), N, V, Vp);
    matmul_backward(d.lnf.data(), grad(WTE, 0), nullptr, d.logits.data(), a.lnf.data(), p[WTE], N, C, Vp);
    layernorm_backward(d.residual3.data() + (L - 1) * NC, grad(LNFW, 0), grad(LNFB, 0), d.lnf.data(),
                       a.residual3.data() + (L - 1) * NC, p[LNFW], a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NC;
        float* dresidual = l == 0 ? d.encoded.data() : d.residual3.data() + (l - 1) * NC;
        residual_backward(d.residual2.data() + l * NC, d.fcproj.data() + l * NC, d.residual3.data() + l * NC,
                          (int)NC);
        matmul_backward(d.fch_gelu.data() + l * 4 * NC, grad(FCPROJW, (size_t)l * 4 * C * C), grad(FCPROJB, l * C),
                        d.fcproj.data() + l * NC, a.fch_gelu.data() + l * 4 * NC, p[FCPROJW] + (size_t)l * 4 * C * C,
                        N, 4 * C, C);
        lora_backward(lora, l, FC_PROJ_TARGET, d.fch_gelu.data() + l * 4 * NC, d.fcproj.data() + l * NC,
                      a.fch_gelu.data() + l * 4 * NC, N);
        gelu_backward(d.fch.data() + l * 4 * NC, a.fch.data() + l * 4 * NC, d.fch_gelu.data() + l * 4 * NC,
                      (int)(4 * NC));
        matmul_backward(d.ln2.data() + l * NC, grad(FCW, (size_t)l * 4 * C * C), grad(FCB, l * 4 * C),
                        d.fch.data() + l * 4 * NC, a.ln2.data() + l * NC, p[FCW] + (size_t)l * 4 * C * C, N, C,
                        4 * C);
        lora_backward(lora, l, FC_TARGET, d.ln2.data() + l * NC, d.fch.data() + l * 4 * NC, a.ln2.data() + l * NC, N);
        layernorm_backward(d.residual2.data() + l * NC, grad(LN2W, l * C), grad(LN2B, l * C), d.ln2.data() + l * NC,
                           a.residual2.data() + l * NC, p[LN2W] + l * C, a.ln2_mean.data() + l * N,
                           a.ln2_rstd.data() + l * N, N, C);
        residual_backward(dresidual, d.attproj.data() + l * NC, d.residual2.data() + l * NC, (int)NC);
        matmul_backward(d.atty.data() + l * NC, grad(ATTPROJW, (size_t)l * C * C), grad(ATTPROJB, l * C),
                        d.attproj.data() + l * NC, a.atty.data() + l * NC, p[ATTPROJW] + (size_t)l * C * C, N, C, C);
        lora_backward(lora, l, ATTN_PROJ_TARGET, d.atty.data() + l * NC, d.attproj.data() + l * NC,
                      a.atty.data() + l * NC, N);
        attention_backward(d.qkv.data() + l * 3 * NC, d.preatt.data() + l * att_size, d.att.data() + l * att_size,
                           d.atty.data() + l * NC, a.qkv.data() + l * 3 * NC, a.att.data() + l * att_size, B, T, C,
                           NH);
        matmul_backward(d.ln1.data() + l * NC, grad(QKVW, (size_t)l * 3 * C * C), grad(QKVB, l * 3 * C),
                        d.qkv.data() + l * 3 * NC, a.ln1.data() + l * NC, p[QKVW] + (size_t)l * 3 * C * C, N, C,
                        3 * C);
        lora_backward(lora, l, QKV_TARGET, d.ln1.data() + l * NC, d.qkv.data() + l * 3 * NC, a.ln1.data() + l * NC, N);
        layernorm_backward(dresidual, grad(LN1W, l * C), grad(LN1B, l * C), d.ln1.data() + l * NC, residual,
                           p[LN1W] + l * C, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, N, C);
    }
    if (!lora) encoder_backward(g[WTE], g[WPE], d.encoded.data(), model->inputs.data(), B, T, C);
}

float model_update(Model* model, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                   int t) {
    if (LoraState* s = model->lora.get()) {
        const double norm = clip_by_global_norm(s->grads, grad_clip);
        adamw_update(s->params.data(), s->grads.data(), s->m.data(), s->v.data(), s->params.size(), lr, beta1, beta2,
                     eps, weight_decay, t);
        return (float)norm;
    }
    const double norm = clip_by_global_norm(model->grads, grad_clip);
    size_t offset = 0;
    for (int i = 0; i < kNumTensors; i++) {
        adamw_update(model->params.data() + offset, model->grads.data() + offset, model->m.data() + offset,
                     model->v.data() + offset, model->sizes[i], lr, beta1, beta2, eps,
                     kDecay[i] ? weight_decay : 0.0f, t);
        offset += model->sizes[i];
    }
    return (float)norm;
}

// ------------------------------------------------------------------------------------------------------------
// LoRA

void model_enable_lora(Model* model, const LoraConfig& lc, unsigned seed) {
    const std::string error = lora_config_error(lc.rank, lc.alpha, lc.targets);
    if (!error.empty()) die("model_enable_lora", error.c_str());
    if (model->lora && model->lora->merged)
        die("model_enable_lora", "the LoRA adapters are merged (lora_unmerge first)");
    auto s = std::make_unique<LoraState>(model->cfg, lc);
    // mt19937's output sequence is fixed by the standard (its distributions are not): 24 bits -> [0, 1).
    std::mt19937 gen(seed);
    for (const LoraSlot& slot : s->slots) {
        const double bound = 1.0 / std::sqrt((double)slot.in);
        for (size_t i = 0; i < (size_t)lc.rank * slot.in; i++)
            s->params[slot.a + i] = (float)(bound * (2.0 * (double)(gen() >> 8) / 16777216.0 - 1.0));
    }
    model->lora = std::move(s);
}

const LoraConfig* model_lora(const Model* model) { return model->lora ? &model->lora->cfg : nullptr; }
size_t model_lora_num_params(const Model* model) { return model->lora ? model->lora->params.size() : 0; }
float* model_lora_params(Model* model) { return model->lora ? model->lora->params.data() : nullptr; }
float* model_lora_grads(Model* model) { return model->lora ? model->lora->grads.data() : nullptr; }

bool lora_load(Model* model, const char* path, std::string* error) {
    auto fail = [&](const std::string& what) {
        *error = std::string(path) + ": " + what;
        return false;
    };
    if (model->lora && model->lora->merged) return fail("the model's LoRA adapters are merged (lora_unmerge first)");
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path, "rb"), std::fclose);
    if (!f) return fail(std::string("cannot open adapter file: ") + std::strerror(errno));
    std::fseek(f.get(), 0, SEEK_END);
    const long size = std::ftell(f.get());
    std::fseek(f.get(), 0, SEEK_SET);
    int header[kHeaderInts];
    if (size < (long)sizeof header || std::fread(header, sizeof header, 1, f.get()) != 1)
        return fail(strprintf("truncated adapter header (%ld bytes)", size));
    if (header[0] != kLoraMagic) return fail(strprintf("bad adapter magic %d (expected %d)", header[0], kLoraMagic));
    if (header[1] != kLoraVersion)
        return fail(strprintf("unsupported adapter version %d (expected %d)", header[1], kLoraVersion));
    float alpha;
    std::memcpy(&alpha, &header[3], 4);
    const std::string bad_config = lora_config_error(header[2], alpha, header[4]);
    if (!bad_config.empty()) return fail(bad_config);
    const Config& c = model->cfg;
    if (header[5] != c.num_layers || header[6] != c.channels)
        return fail(strprintf("adapters for %d layers, %d channels; the model has %d layers, %d channels",
                              header[5], header[6], c.num_layers, c.channels));
    // Sizes from the header alone, so that a huge rank is reported rather than allocated.
    int tensors = 0;
    long long elements = 0;
    for (const LoraTargetInfo& info : kLoraTargets)
        if (header[4] & info.bit) {
            tensors += 2 * c.num_layers;
            elements += (long long)c.num_layers * header[2] * (info.in_mult + info.out_mult) * c.channels;
        }
    if (header[7] != tensors)
        return fail(
            strprintf("header says %d tensors, expected %d (A and B per layer and target)", header[7], tensors));
    const long long expected = (long long)sizeof header + 4 * elements;
    if (size < expected) return fail(strprintf("truncated: %ld bytes, its header implies %lld", size, expected));
    if (size > expected) return fail(strprintf("%ld bytes, its header implies %lld (trailing data)", size, expected));
    auto s = std::make_unique<LoraState>(c, LoraConfig{header[2], alpha, (unsigned)header[4]});
    if (std::fread(s->params.data(), 4, s->params.size(), f.get()) != s->params.size())
        return fail("read error in the tensors");
    model->lora = std::move(s);
    return true;
}

bool lora_save(const Model* model, const char* path, std::string* error) {
    auto fail = [&](const std::string& what) {
        *error = std::string(path) + ": " + what;
        return false;
    };
    const LoraState* s = model->lora.get();
    if (!s) return fail("the model has no LoRA adapters to save");
    int header[kHeaderInts] = {kLoraMagic, kLoraVersion, s->cfg.rank, 0, (int)s->cfg.targets, model->cfg.num_layers,
                               model->cfg.channels, 2 * (int)s->slots.size()};
    std::memcpy(&header[3], &s->cfg.alpha, 4);
    const std::string tmp = std::string(path) + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return fail(std::string("cannot write adapter file: ") + std::strerror(errno));
    const bool written = std::fwrite(header, sizeof header, 1, f) == 1 &&
                         std::fwrite(s->params.data(), 4, s->params.size(), f) == s->params.size();
    if (std::fclose(f) != 0 || !written) return fail("write error");
    if (std::rename(tmp.c_str(), path) != 0)
        return fail(std::string("cannot rename ") + tmp + ": " + std::strerror(errno));
    return true;
}

namespace {

// W0 += sign (alpha/r) B A for every adapted weight, the product summed in double and the sum rounded once.
void lora_add_product(Model* model, double sign) {
    const LoraState& s = *model->lora;
    const Tensors p(model->params.data(), model->sizes);
    const int r = s.cfg.rank;
    for (const LoraSlot& slot : s.slots) {
        float* w = p[slot.weight] + (size_t)slot.layer * slot.out * slot.in;
        const float* A = s.params.data() + slot.a;
        const float* B = s.params.data() + slot.b;
#pragma omp parallel for
        for (int o = 0; o < slot.out; o++)
            for (int i = 0; i < slot.in; i++) {
                double sum = 0.0;
                for (int k = 0; k < r; k++) sum += (double)B[(size_t)o * r + k] * A[(size_t)k * slot.in + i];
                float& wi = w[(size_t)o * slot.in + i];
                wi = (float)((double)wi + sign * s.scale * sum);
            }
    }
}

}  // namespace

void lora_merge(Model* model) {
    if (!model->lora || model->lora->merged) die("lora_merge", "no unmerged LoRA adapters");
    lora_add_product(model, 1.0);
    model->lora->merged = true;
}

void lora_unmerge(Model* model) {
    if (!model->lora || !model->lora->merged) die("lora_unmerge", "no merged LoRA adapters");
    lora_add_product(model, -1.0);
    model->lora->merged = false;
}

}  // namespace cpuref
