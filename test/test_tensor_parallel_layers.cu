// Tensor parallelism against the dense model, in fp32 on real ranks (test/test_tensor_parallel_layers.sh runs it
// under scripts/launch.sh --one-gpu N, N = 1, 2, 4: the tensor-parallel degree is the world size, dp = 1):
//   - the whole model (2 layers, 4 heads, C = 256; with tp > 1 also under sequence parallelism): every rank's gradients, reassembled with
//     assemble_whole_model, against a tp = 1 model of the same initialisation and batch, tensor by tensor
//     (relative L2 <= 1e-4: only the order of the sums differs); each rank's own gradient buffer against its
//     slices of tp 1's; the loss (1e-5 relative) and each rank's logits columns (1e-5 relative L2);
//   - each split product of block 0 against the dense one (relative L2 <= 1e-6), the slices cut by
//     ParameterLayout::for_each_full_run from a whole-model vector and the ranks' sums taken by TensorParallel's f
//     and g (ncclAllReduce on the tensor-parallel communicator). Column-parallel (qkv by whole heads, fc):
//     Y_r = X W_r^T + b_r is dense Y's columns, the sum of the dX_r is dense dX, dW_r and db_r dense slices.
//     Row-parallel (attn-proj, fc-proj): the sum of X_r W_r^T (+ b on rank 0) is dense Y, dX_r is dense dX's
//     columns, dW_r dense dW's columns, db dense db.
// Every rank computes its own tp = 1 reference (the GPU is shared); each check's error is gathered over the
// ranks and rank 0 prints one PASS/FAIL line with the worst; every rank exits 1 on a failure.
#define TESTING
#include "../train_gpt.cu"
#include "../model/whole_model.cuh"  // defines: set_parameters, local_part, assemble_whole_model
#include "check.h"
#include <numeric>
#include <random>

namespace {

// Checks measured on every rank, in the same order; finish() gathers them and rank 0 prints the worst.
struct Report {
    struct Entry {
        std::string name;
        double tol;
        float error, norm;  // norm: of the reference (a check of two empty or zero tensors fails)
        bool control;       // a negative control: passes when every rank's error exceeds tol
    };
    std::vector<Entry> entries;
    void add_error(const std::string& name, double tol, double error, double norm, bool control = false) {
        entries.push_back({name, tol, (float)error, (float)norm, control});
    }
    void add(const std::string& name, double tol, const float* ours, const float* ref, size_t n) {
        add_error(name, tol, relative_l2(ours, ref, n), sqrt(std::inner_product(ref, ref + n, ref, 0.0)));
    }
    void add(const std::string& name, double tol, const std::vector<float>& ours, const std::vector<float>& ref) {
        if (ours.size() != ref.size()) add_error(name + " (sizes " + std::to_string(ours.size()) + " vs " + std::to_string(ref.size()) + ")", tol, INFINITY, 0);
        else add(name, tol, ours.data(), ref.data(), ref.size());
    }
    void finish(const std::string& prefix, const ProcessMesh& mesh, const ProcessGroup& pg, cudaStream_t stream) {
        std::vector<float> mine;
        for (const Entry& e : entries) mine.insert(mine.end(), {e.error, e.norm});
        std::vector<std::vector<float>> all = {mine};
        if (mesh.tensor.size > 1) {
            TensorParallel<float> group;
            group.group = mesh.tensor;
            all = group.all_gather_host(mine, stream, pg);
        }
        for (size_t i = 0; i < entries.size(); i++) {
            const bool control = entries[i].control;
            float worst = control ? INFINITY : 0.0f, norm = INFINITY;
            for (const auto& rank : all) {
                if (std::isnan(rank[2 * i]) || (control ? rank[2 * i] < worst : rank[2 * i] > worst)) worst = rank[2 * i];
                norm = std::min(norm, rank[2 * i + 1]);
            }
            const bool ok = (control ? worst > entries[i].tol : worst <= entries[i].tol) && norm > 0.0f;
            const std::string detail = fmt(control ? "relative error %.3e (must exceed %.0e), smallest of " : "relative error %.3e (tolerance %.0e), worst of ",
                                           worst, entries[i].tol) +
                                       std::to_string(all.size()) + fmt(" ranks, reference norm %.4g", norm);
            if (pg.rank == 0) check(ok, prefix + entries[i].name, detail);
            else if (!ok) check_failures()++;
        }
    }
};

// Every tensor of a layout (whole model or one rank's slices): visit(name, offset, count).
template <typename F> void for_each_tensor(const ParameterLayout& layout, F visit) {
    const size_t C = layout.config.channels;
    visit(std::string("wte"), layout.wte, layout.wpe - layout.wte);
    visit(std::string("wpe"), layout.wpe, (size_t)layout.config.max_seq_len * C);
    for (int l = 0; l < layout.config.num_layers; l++)
        for (int t = 0; t < kBlockTensors; t++)
            visit("layer " + std::to_string(l) + " " + block_tensor_name(t), layout.tensor(l, (BlockTensor)t), layout.block_tensor_size[t]);
    visit(std::string("lnfw"), layout.lnfw, C);
    visit(std::string("lnfb"), layout.lnfb, C);
}

// Part 1: the whole model at tp = world (with or without sequence parallelism) against tp = 1.
void model_checks(const ModelConfig& config, const ProcessGroup& pg, const ProcessMesh& mesh, cudaStream_t stream, Report& report,
                  bool sequence_parallel) {
    const std::string sp = sequence_parallel ? "sequence parallel: " : "";
    const int B = 2, T = config.max_seq_len, N = B * T, Vp = config.padded_vocab_size;
    std::mt19937 rng(1234);  // the same batch on every rank
    std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
    std::vector<int> inputs(N), targets(N);
    for (int i = 0; i < N; i++) inputs[i] = token(rng), targets[i] = token(rng);
    ProcessGroup single;  // the reference: one process, no communicator
    const ProcessMesh none;
    Transformer<float> model(config, pg, mesh, 0, stream), reference(config, single, none, 0, stream);
    model.sequence_parallel = sequence_parallel;
    for (Transformer<float>* m : {&model, &reference}) {
        m->deterministic_attention = true;
        m->allocate(B, T);
        init_parameters(*m, 77);  // the whole model; a tensor-parallel rank keeps its slices
        m->upload_batch(inputs.data(), targets.data());
    }
    // logits (a forward without the gradient keeps them): this rank's columns [rank Vl, (rank + 1) Vl) of tp 1's
    const int Vl = model.layout.vocab_rows(), r = mesh.tensor.rank;
    model.forward(true, 0.0f);
    reference.forward(true, 0.0f);
    pg.synchronize(stream);
    const std::vector<float> logits = device_to_host_floats(model.logits, (size_t)N * Vl);
    const std::vector<float> all_columns = device_to_host_floats(reference.logits, (size_t)N * Vp);
    std::vector<float> columns((size_t)N * Vl);
    for (size_t n = 0; n < (size_t)N; n++)
        std::copy_n(all_columns.begin() + n * Vp + (size_t)r * Vl, Vl, columns.begin() + n * Vl);
    report.add(sp + "logits: each rank's vocabulary columns = tp 1's", 1e-5, logits, columns);

    float loss[2];
    int i = 0;
    for (Transformer<float>* m : {&model, &reference}) {
        m->zero_grad();
        m->forward(true, m->dloss(1));
        m->accumulate_loss();
        loss[i++] = m->take_mean_loss();
        m->backward();
    }
    report.add_error(sp + fmt("loss %.7f = tp 1's %.7f", loss[0], loss[1]), 1e-5, fabs(loss[0] - loss[1]) / fabs(loss[1]), fabs(loss[1]));

    const std::vector<float> local = model.zero->gradients_host();        // this rank's slices (model.layout)
    const std::vector<float> whole = assemble_whole_model(model, local, model.stage_parts);  // all ranks' (full_layout)
    const std::vector<float> expected = reference.zero->gradients_host();
    if (whole.size() != expected.size()) report.add(sp + "reassembled gradients: size", 0, whole, expected);
    else for_each_tensor(model.full_layout, [&](const std::string& name, size_t offset, size_t count) {
        report.add(sp + "grad " + name + " (reassembled) = tp 1's", 1e-4, &whole[offset], &expected[offset], count);
    });
    // each rank's own buffer, replicated tensors included (the reassembly takes those of one rank only)
    const std::vector<float> slices = local_part(model, expected);
    double worst = 0.0, norm = INFINITY;
    for_each_tensor(model.layout, [&](const std::string&, size_t offset, size_t count) {
        const double e = relative_l2(&local[offset], &slices[offset], count);
        if (std::isnan(e) || e > worst) worst = e;
        norm = std::min(norm, sqrt(std::inner_product(&slices[offset], &slices[offset] + count, &slices[offset], 0.0)));
    });
    report.add_error(sp + "grad: each rank's tensors = its slices of tp 1's (worst tensor)", 1e-4, worst, norm);
}

// fp32 device copy of a host vector (or `count` zeros).
struct Device {
    float* p = nullptr;
    size_t n = 0;
    explicit Device(size_t count) : n(count) {
        cudaCheck(cudaMalloc(&p, n * sizeof(float)));
        cudaCheck(cudaMemset(p, 0, n * sizeof(float)));
    }
    explicit Device(const std::vector<float>& host) : Device(host.size()) {
        cudaCheck(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    }
    Device(const Device&) = delete;
    ~Device() { cudaFree(p); }
    std::vector<float> host() const { return device_to_host_floats(p, n); }
};

// Rank `rank`'s slice of block 0's tensor t, cut from the dense tensor by for_each_full_run.
template <typename V> V tp_slice(const ParameterLayout& full, const ParameterLayout& local, int rank, BlockTensor t, const V& dense) {
    V out(local.block_tensor_size[t]);
    const size_t begin = full.tensor(0, t), end = begin + full.block_tensor_size[t];
    size_t covered = 0;
    local.for_each_full_run(full, rank, [&](size_t from, size_t to, size_t n) {
        if (from < begin || from >= end) return;
        std::copy_n(dense.begin() + (from - begin), n, out.begin() + (to - local.tensor(0, t)));
        covered += n;
    });
    if (covered != out.size()) die("internal: for_each_full_run does not cover " + std::string(block_tensor_name(t)));
    return out;
}
std::vector<size_t> iota(size_t n) {
    std::vector<size_t> v(n);
    std::iota(v.begin(), v.end(), 0);
    return v;
}
// The columns `map` of an (N, M) matrix.
std::vector<float> columns(const std::vector<float>& m, size_t M, const std::vector<size_t>& map) {
    const size_t N = m.size() / M;
    std::vector<float> out(N * map.size());
    for (size_t n = 0; n < N; n++)
        for (size_t j = 0; j < map.size(); j++) out[n * map.size() + j] = m[n * M + map[j]];
    return out;
}

// One product y = x w^T + b (x: N x in, w: out x in) and its backward for dy: matmul_forward / matmul_backward.
struct Product {
    std::vector<float> y, dx, dw, db;
};
Product product(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b, const std::vector<float>& dy,
                int N, int in, int out, float* scratch, const ProcessGroup& pg, cudaStream_t stream,
                const std::function<void(float*, float*)>& between = nullptr) {
    Device X(x), W(w), Y((size_t)N * out), DY(dy), DX((size_t)N * in), DW(w.size()), DB(out);
    std::unique_ptr<Device> bias(b ? new Device(*b) : nullptr);
    matmul_forward(Y.p, X.p, W.p, bias ? bias->p : nullptr, N, in, out, stream);
    matmul_backward(DX.p, DW.p, DB.p, scratch, DY.p, X.p, W.p, N, in, out, stream);
    if (between) between(Y.p, DX.p);  // the collectives (g on y, f on dx)
    pg.synchronize(stream);  // within the deadline: a failed peer ends this rank with a message
    return {Y.host(), DX.host(), DW.host(), DB.host()};
}

// Part 2: each split product of block 0 against the dense product.
void layer_checks(const ModelConfig& config, const ProcessGroup& pg, const ProcessMesh& mesh, cudaStream_t stream, Report& report) {
    const int tp = mesh.tensor.size, rank = mesh.tensor.rank, C = config.channels, N = 128;
    const ParameterLayout full(config, 8), local(config, 8, tp);
    TensorParallel<float> ops;  // f and g over the tensor-parallel communicator
    ops.group = mesh.tensor;
    ops.allocate((size_t)N);  // f's backward runs on the group's own stream
    std::mt19937 rng(99);  // the same on every rank
    std::normal_distribution<float> normal;
    auto random = [&](size_t n) { std::vector<float> v(n); for (float& x : v) x = normal(rng); return v; };
    std::vector<float> whole(full.total, 0.0f);  // a whole-model vector, block 0 random
    for (size_t i = 0; i < full.block_size; i++) whole[full.tensor(0, LN1W) + i] = normal(rng);
    auto dense = [&](BlockTensor t) { return std::vector<float>(whole.begin() + full.tensor(0, t), whole.begin() + full.tensor(0, t) + full.block_tensor_size[t]); };
    float* scratch;
    cudaCheck(cudaMalloc(&scratch, bias_backward_scratch_floats<float>(4 * C) * sizeof(float)));
    struct Split { const char* name; BlockTensor w, b; int in, out; bool column; };
    const Split splits[] = {{"qkv", QKVW, QKVB, C, 3 * C, true}, {"fc", FCW, FCB, C, 4 * C, true},
                            {"attn-proj", ATTPROJW, ATTPROJB, C, C, false}, {"fc-proj", FCPROJW, FCPROJB, 4 * C, C, false}};
    for (const Split& s : splits) {
        const std::vector<float> W = dense(s.w), bias = dense(s.b), x = random((size_t)N * s.in), dy = random((size_t)N * s.out);
        const Product d = product(x, W, &bias, dy, N, s.in, s.out, scratch, pg, stream);
        const std::vector<float> W_r = tp_slice(full, local, rank, s.w, W);
        const std::string name = std::string(s.name) + (s.column ? " (column-parallel): " : " (row-parallel): ");
        if (s.column) {  // this rank's output columns: its rows of W, as its slice of the bias says
            const std::vector<size_t> cols = tp_slice(full, local, rank, s.b, iota(s.out));
            const std::vector<float> b_r = tp_slice(full, local, rank, s.b, bias);
            const Product p = product(x, W_r, &b_r, columns(dy, s.out, cols), N, s.in, (int)cols.size(), scratch, pg, stream,
                                      [&](float*, float* dx) {
                                          ops.begin_f_backward(dx, (size_t)N * s.in, false, stream);
                                          ops.end_f_backward(stream);
                                      });
            report.add(name + "forward X W_r^T + b_r = dense Y's columns", 1e-6, p.y, columns(d.y, s.out, cols));
            if (tp > 1 && s.w == QKVW) {  // the same comparison against the next rank's columns must fail
                const std::vector<float> other = columns(d.y, s.out, tp_slice(full, local, (rank + 1) % tp, s.b, iota(s.out)));
                report.add_error(name + "control: Y_r against the next rank's columns differs", 1e-2,
                                 relative_l2(p.y.data(), other.data(), other.size()), 1.0, true);
            }
            report.add(name + "f: sum over ranks of dX_r = dense dX", 1e-6, p.dx, d.dx);
            report.add(name + "dW_r = dense dW's rows", 1e-6, p.dw, tp_slice(full, local, rank, s.w, d.dw));
            report.add(name + "db_r = dense db's slice", 1e-6, p.db, tp_slice(full, local, rank, s.b, d.db));
        } else {  // this rank's input columns: those of W_r's first row
            const std::vector<size_t> slice = tp_slice(full, local, rank, s.w, iota(W.size()));
            const std::vector<size_t> cols(slice.begin(), slice.begin() + W_r.size() / s.out);
            const std::vector<float> x_r = columns(x, s.in, cols);
            const Product p = product(x_r, W_r, rank == 0 ? &bias : nullptr, dy, N, (int)cols.size(), s.out, scratch, pg, stream,
                                      [&](float* y, float*) { ops.g_forward(y, nullptr, (size_t)N * s.out, 1, stream); });
            report.add(name + "g: sum over ranks of X_r W_r^T (+ b on rank 0) = dense Y", 1e-6, p.y, d.y);
            report.add(name + "dX_r = dense dX's columns", 1e-6, p.dx, columns(d.dx, s.in, cols));
            report.add(name + "dW_r = dense dW's columns", 1e-6, p.dw, tp_slice(full, local, rank, s.w, d.dw));
            report.add(name + "db = dense db", 1e-6, p.db, d.db);
        }
    }
    pg.synchronize(stream);
    cudaCheck(cudaFree(scratch));
}

}  // namespace

int main(int argc, char** argv) {
    check_suite("tensor_parallel_layers");
    ProcessGroup pg = ProcessGroup::from_environment(&argc, &argv);
    pg.connect({"", 120});
    ProcessMesh mesh;
    mesh.build(pg, MeshShape{pg.world, 1, 1});  // tp = every rank, dp = 1
    matmul_setup(false);  // fp32 exact, cuBLASLt's first choice: deterministic
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    ModelConfig config;
    config.num_layers = 2;
    config.num_heads = 4;
    config.channels = 256;
    config.max_seq_len = 64;
    const std::string problem = config_problem(config) + tensor_parallel_problem(config, pg.world);
    if (!problem.empty()) die(problem);
    Report report;
    model_checks(config, pg, mesh, stream, report, false);
    if (pg.world > 1) model_checks(config, pg, mesh, stream, report, true);
    layer_checks(config, pg, mesh, stream, report);
    report.finish("tp " + std::to_string(pg.world) + ": ", mesh, pg, stream);
    cudaCheck(cudaStreamDestroy(stream));
    matmul_teardown();
    mesh.destroy();
    pg.destroy();
    return check_failures() == 0 ? 0 : 1;
}
