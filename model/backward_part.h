// What a chunk's backward computes (Transformer::backward_chunk): both gradients in one pass (kBoth), or the halves of
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; distributed/pipeline_schedule.h): kInputGradient (B),
// everything on the path to the gradient of the chunk's input, which the previous stage waits for, and later
// kWeightGradient (W), the gradients that nothing waits for. B keeps the gradients that its own kernels sum at no
// extra reads (the LayerNorms' weights and biases, and the row-parallel biases and the qkv bias's value part taken
// in the LayerNorm backward); W takes the products' weight gradients, the biases summed from the output gradients
// that B kept (LayerOutputGrads), and the embeddings'.
// defines: BackwardPart
#pragma once

enum class BackwardPart { kBoth, kInputGradient, kWeightGradient };
