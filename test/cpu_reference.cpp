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

void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B, int T, int C, int NH) {
    const int C3 = 3 * C, hs = C / NH;
    const double scale = 1.0 / std::sqrt((double)hs);
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float* pre = preatt + (((size_t)b * NH + h) * T + t) * T;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    pre[t2] = (float)(dot(q, k, hs) * scale);
                    maxval = std::max(maxval, pre[t2]);
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) sum += std::exp((double)pre[t2] - maxval);
                for (int t2 = 0; t2 <= t; t2++) a[t2] = (float)(std::exp((double)pre[t2] - maxval) / sum);
                for (int t2 = t + 1; t2 < T; t2++) pre[t2] = a[t2] = 0.0f;
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int t2 = 0; t2 <= t; t2++)
                        acc += (double)a[t2] * qkv[((size_t)b * T + t2) * C3 + 2 * C + h * hs + i];
                    o[i] = (float)acc;
                }
            }
}

void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
    const int C3 = 3 * C, hs = C / NH;
    const double scale = 1.0 / std::sqrt((double)hs);
    // One task per (b, h): the rows t2 of k and v receive gradient from every query t >= t2, so parallelising
    // over t would race. Gradients of q, k, v are accumulated in double and added once at the end.
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            std::vector<double> dq((size_t)T * hs, 0.0), dk((size_t)T * hs, 0.0), dv((size_t)T * hs, 0.0);
            auto q_at = [&](int t) { return qkv + ((size_t)b * T + t) * C3 + h * hs; };
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float* da = datt + (((size_t)b * NH + h) * T + t) * T;
                float* dpre = dpreatt + (((size_t)b * NH + h) * T + t) * T;
                const float* d = dout + ((size_t)b * T + t) * C + h * hs;
                // out = sum_t2 att[t2] v[t2]
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = q_at(t2) + 2 * C;
                    da[t2] += (float)dot(v, d, hs);
                    for (int i = 0; i < hs; i++) dv[(size_t)t2 * hs + i] += (double)a[t2] * d[i];
                }
                // softmax: dpre[t2] = att[t2] (datt[t2] - sum_t3 att[t3] datt[t3])
                double weighted = 0.0;
                for (int t2 = 0; t2 <= t; t2++) weighted += (double)a[t2] * da[t2];
                for (int t2 = 0; t2 <= t; t2++) dpre[t2] += (float)((double)a[t2] * (da[t2] - weighted));
                // preatt = scale * q . k
                const float* q = q_at(t);
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = q_at(t2) + C;
                    const double g = scale * dpre[t2];
                    for (int i = 0; i < hs; i++) {
                        dq[(size_t)t * hs + i] += g * k[i];
                        dk[(size_t)t2 * hs + i] += g * q[i];
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                float* dst = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                for (int i = 0; i < hs; i++) {
                    dst[i] += (float)dq[(size_t)t * hs + i];
                    dst[C + i] += (float)dk[(size_t)t * hs + i];
                    dst[2 * C + i] += (float)dv[(size_t)t * hs + i];
                }
            }
        }
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
        losses[n] = (float)(std::log(sum) + maxval - x[targets[n]]);
    }
}

void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss_per_row, int N,
                                   int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * Vp;
        float* d = dlogits + (size_t)n * Vp;
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

}  // namespace

struct Model {
    Config cfg{};
    size_t sizes[kNumTensors]{};
    size_t num_params = 0;
    std::vector<float> params, grads, m, v;
    int B = 0, T = 0;
    Acts acts, dacts;
    std::vector<int> inputs, targets;  // targets empty after a forward without targets
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
void model_zero_grad(Model* model) { std::fill(model->grads.begin(), model->grads.end(), 0.0f); }

float model_forward(Model* model, const int* inputs, const int* targets, int B, int T) {
    const Config& c = model->cfg;
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, V = c.vocab_size, Vp = c.padded_vocab_size;
    const int N = B * T;
    if (B <= 0 || T <= 0 || T > c.max_seq_len) {
        std::fprintf(stderr, "cpuref: model_forward: bad B=%d T=%d (max seq len %d)\n", B, T, c.max_seq_len);
        std::exit(1);
    }
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V))) {
            std::fprintf(stderr, "cpuref: model_forward: token out of range [0, %d) at %d\n", V, i);
            std::exit(1);
        }
    if (B != model->B || T != model->T) {
        model->acts.resize(c, B, T);
        model->dacts.resize(c, B, T);
        model->B = B;
        model->T = T;
    }
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
        attention_forward(atty, a.preatt.data() + l * att_size, a.att.data() + l * att_size, qkv, B, T, C, NH);
        matmul_forward(attproj, atty, p[ATTPROJW] + (size_t)l * C * C, p[ATTPROJB] + l * C, N, C, C);
        residual_forward(residual2, residual, attproj, (int)NC);
        layernorm_forward(ln2, a.ln2_mean.data() + l * N, a.ln2_rstd.data() + l * N, residual2, p[LN2W] + l * C,
                          p[LN2B] + l * C, N, C);
        matmul_forward(fch, ln2, p[FCW] + (size_t)l * 4 * C * C, p[FCB] + l * 4 * C, N, C, 4 * C);
        gelu_forward(fch_gelu, fch, (int)(4 * NC));
        matmul_forward(fcproj, fch_gelu, p[FCPROJW] + (size_t)l * 4 * C * C, p[FCPROJB] + l * C, N, 4 * C, C);
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
    return (float)(sum / N);
}

void model_backward(Model* model) {
    if (model->targets.empty()) {
        std::fprintf(stderr, "cpuref: model_backward needs a preceding forward with targets\n");
        std::exit(1);
    }
    const Config& c = model->cfg;
    const int B = model->B, T = model->T, N = B * T;
    const int C = c.channels, L = c.num_layers, NH = c.num_heads, V = c.vocab_size, Vp = c.padded_vocab_size;
    const size_t NC = (size_t)N * C, att_size = (size_t)B * NH * T * T;
    const Tensors p(model->params.data(), model->sizes);
    const Tensors g(model->grads.data(), model->sizes);
    const Acts& a = model->acts;
    Acts& d = model->dacts;
    d.zero();  // the kernels accumulate

    softmax_crossentropy_backward(d.logits.data(), a.probs.data(), model->targets.data(), 1.0f / N, N, V, Vp);
    matmul_backward(d.lnf.data(), g[WTE], nullptr, d.logits.data(), a.lnf.data(), p[WTE], N, C, Vp);
    layernorm_backward(d.residual3.data() + (L - 1) * NC, g[LNFW], g[LNFB], d.lnf.data(),
                       a.residual3.data() + (L - 1) * NC, p[LNFW], a.lnf_mean.data(), a.lnf_rstd.data(), N, C);
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NC;
        float* dresidual = l == 0 ? d.encoded.data() : d.residual3.data() + (l - 1) * NC;
        residual_backward(d.residual2.data() + l * NC, d.fcproj.data() + l * NC, d.residual3.data() + l * NC,
                          (int)NC);
        matmul_backward(d.fch_gelu.data() + l * 4 * NC, g[FCPROJW] + (size_t)l * 4 * C * C, g[FCPROJB] + l * C,
                        d.fcproj.data() + l * NC, a.fch_gelu.data() + l * 4 * NC, p[FCPROJW] + (size_t)l * 4 * C * C,
                        N, 4 * C, C);
        gelu_backward(d.fch.data() + l * 4 * NC, a.fch.data() + l * 4 * NC, d.fch_gelu.data() + l * 4 * NC,
                      (int)(4 * NC));
        matmul_backward(d.ln2.data() + l * NC, g[FCW] + (size_t)l * 4 * C * C, g[FCB] + l * 4 * C,
                        d.fch.data() + l * 4 * NC, a.ln2.data() + l * NC, p[FCW] + (size_t)l * 4 * C * C, N, C,
                        4 * C);
        layernorm_backward(d.residual2.data() + l * NC, g[LN2W] + l * C, g[LN2B] + l * C, d.ln2.data() + l * NC,
                           a.residual2.data() + l * NC, p[LN2W] + l * C, a.ln2_mean.data() + l * N,
                           a.ln2_rstd.data() + l * N, N, C);
        residual_backward(dresidual, d.attproj.data() + l * NC, d.residual2.data() + l * NC, (int)NC);
        matmul_backward(d.atty.data() + l * NC, g[ATTPROJW] + (size_t)l * C * C, g[ATTPROJB] + l * C,
                        d.attproj.data() + l * NC, a.atty.data() + l * NC, p[ATTPROJW] + (size_t)l * C * C, N, C, C);
        attention_backward(d.qkv.data() + l * 3 * NC, d.preatt.data() + l * att_size, d.att.data() + l * att_size,
                           d.atty.data() + l * NC, a.qkv.data() + l * 3 * NC, a.att.data() + l * att_size, B, T, C,
                           NH);
        matmul_backward(d.ln1.data() + l * NC, g[QKVW] + (size_t)l * 3 * C * C, g[QKVB] + l * 3 * C,
                        d.qkv.data() + l * 3 * NC, a.ln1.data() + l * NC, p[QKVW] + (size_t)l * 3 * C * C, N, C,
                        3 * C);
        layernorm_backward(dresidual, g[LN1W] + l * C, g[LN1B] + l * C, d.ln1.data() + l * NC, residual,
                           p[LN1W] + l * C, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, N, C);
    }
    encoder_backward(g[WTE], g[WPE], d.encoded.data(), model->inputs.data(), B, T, C);
}

float model_update(Model* model, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_clip,
                   int t) {
    const double norm = global_norm(model->grads.data(), model->num_params);
    if (grad_clip > 0.0f && norm > grad_clip) {
        const float scale = (float)(grad_clip / norm);
        for (float& gr : model->grads) gr *= scale;
    }
    size_t offset = 0;
    for (int i = 0; i < kNumTensors; i++) {
        adamw_update(model->params.data() + offset, model->grads.data() + offset, model->m.data() + offset,
                     model->v.data() + offset, model->sizes[i], lr, beta1, beta2, eps,
                     kDecay[i] ? weight_decay : 0.0f, t);
        offset += model->sizes[i];
    }
    return (float)norm;
}

}  // namespace cpuref
