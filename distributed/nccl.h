// The NCCL element type of each compute precision, for every collective of the distributed files. Error checks
// (ncclCheck) and the communicators are process_group.h's and mesh.h's.
// defines: nccl_type
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

template <typename T> inline ncclDataType_t nccl_type();
template <> inline ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> inline ncclDataType_t nccl_type<__nv_bfloat16>() { return ncclBfloat16; }
template <> inline ncclDataType_t nccl_type<__half>() { return ncclFloat16; }
