// ZB-H1's split backward (BackwardPart): the output gradients of a block's four products, which the input-gradient
// pass (B) computes and the weight-gradient pass (W) multiplies with the products' inputs later. N rows each, of
// 3 Cs (this rank's heads' q, k, v), C, 4 Cs (this rank's hidden units) and C columns (whole rows: under sequence
// parallelism the gathered gradient that the product reads). A micro-batch holds a chunk's (one per block) in a
// gradient slot from its B to its W: the schedule's grad_slots, no more than the activation sets. Where W does not
// read the activation set's qkv and fch buffers after B (qkv_grad_in_set, fc_grad_in_set), qkv's and fc's output
// gradients take their place instead of memory of the slot's own: B writes them into a spare buffer of the same
// size, which the slot keeps, and the set's buffer, which B has read for the last time, becomes the spare; W hands
// the slot's buffer back to the set. The buffers rotate, no copies. The model's backward (transformer.cuh) calls
// these; the memory is a part of its activation memory (memory_plan.h counts it).
// defines: LayerOutputGrads, GradientSlots
#pragma once
#include <string>
#include <vector>
#include "../kernels/common.cuh"
#include "config.h"       // defines: ModelConfig, qkv_width, fc_width
#include "memory_plan.h"  // defines: ActivationPlan, qkv_grad_in_set, fc_grad_in_set

template <typename floatX>
struct LayerOutputGrads {
    floatX *qkv, *attproj, *fc, *fcproj;
};

template <typename floatX>
struct GradientSlots {
    // slots[k][g] holds chunk k's blocks' output gradients (one per block) in gradient slot g
    std::vector<std::vector<std::vector<LayerOutputGrads<floatX>>>> slots;
    // the spares that the sets' qkv and fch buffers rotate through, where those buffers take the output gradients
    floatX *spare_qkv = nullptr, *spare_fch = nullptr;
    bool qkv_in_set = false, fc_in_set = false;  // qkv_grad_in_set, fc_grad_in_set at the --recompute level

    // The slots of plan `ap` for micro-batches of N rows, from take(n), which returns the next n elements of the
    // model's activation memory (in activation_counts' order).
    template <typename Take>
    void allocate(Take&& take, const ActivationPlan& ap, size_t N, const ModelConfig& c, int tp, int recompute) {
        qkv_in_set = qkv_grad_in_set(recompute);
        fc_in_set = fc_grad_in_set(recompute);
        slots.assign(ap.chunk_blocks.size(), {});
        for (size_t k = 0; k < ap.grad_slots.size(); k++) {
            slots[k].assign(ap.grad_slots[k], std::vector<LayerOutputGrads<floatX>>(ap.chunk_blocks[k]));
            for (std::vector<LayerOutputGrads<floatX>>& slot : slots[k])
                for (LayerOutputGrads<floatX>& d : slot) {
                    d.qkv = qkv_in_set ? nullptr : take(N * qkv_width(c, tp));  // else a buffer that B hands it
                    d.attproj = take(N * c.channels);
                    d.fc = fc_in_set ? nullptr : take(N * fc_width(c, tp));  // else a buffer that B hands it
                    d.fcproj = take(N * c.channels);
                }
        }
        const bool split_backward = ap.splits_backward();
        spare_qkv = split_backward && qkv_in_set ? take(N * qkv_width(c, tp)) : nullptr;
        spare_fch = split_backward && fc_in_set ? take(N * fc_width(c, tp)) : nullptr;
    }

    // Gradient slot g of chunk k.
    std::vector<LayerOutputGrads<floatX>>& slot(int k, int g) {
        if (g < 0 || g >= (int)slots[k].size())
            die("internal: gradient slot " + std::to_string(g) + " asked for, but chunk " + std::to_string(k) + " has " +
                std::to_string(slots[k].size()));
        return slots[k][g];
    }

    // B: where qkv's and fc's output gradients go for the slot's layer `kept`: the spare, or the slot's own memory.
    floatX* qkv_grad(const LayerOutputGrads<floatX>& kept) const { return qkv_in_set ? spare_qkv : kept.qkv; }
    floatX* fc_grad(const LayerOutputGrads<floatX>& kept) const { return fc_in_set ? spare_fch : kept.fc; }
    // B has read the set's qkv (fch) buffer for the last time: the slot keeps the spare, which holds the output
    // gradient, and the set's buffer becomes the spare until W hands one back.
    void qkv_read(LayerOutputGrads<floatX>& kept, floatX*& set_qkv) { rotate(kept.qkv, spare_qkv, set_qkv, qkv_in_set); }
    void fch_read(LayerOutputGrads<floatX>& kept, floatX*& set_fch) { rotate(kept.fc, spare_fch, set_fch, fc_in_set); }
    // B's copy of a projection's output gradient (N x C: whole rows), which dresidual's next change would overwrite.
    static void keep(floatX* kept, const floatX* grad, size_t elements, cudaStream_t stream) {
        cudaCheck(cudaMemcpyAsync(kept, grad, elements * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    }
    // W, after the output gradients' last read: the set's qkv and fch buffers back from the slot.
    void hand_back(const LayerOutputGrads<floatX>& kept, floatX*& set_qkv, floatX*& set_fch) const {
        if (qkv_in_set) set_qkv = kept.qkv;
        if (fc_in_set) set_fch = kept.fc;
    }

  private:
    static void rotate(floatX*& kept, floatX*& spare, floatX*& set_buffer, bool in_set) {
        if (!in_set) return;
        kept = spare;
        spare = set_buffer;
        set_buffer = nullptr;
    }
};
