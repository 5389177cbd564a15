// Week 8, CUDA C++ route: softmax over the last dimension (reference solution).
//
// One thread block per row. A row of up to kThreads * kMaxPerThread elements is held in registers: one read
// from memory, a block-wide max, a block-wide sum of exp(x - max), one write. Longer rows stream: pass 1: each thread walks the row with stride blockDim.x, keeping the running
// maximum m of the values it has seen and the running sum d of exp(x - m) (online softmax: a new maximum
// rescales the old sum by exp(m_old - m_new)). The block then merges the threads' (m, d) pairs, within each
// warp by shuffles and across warps through shared memory. Pass 2 reads the row again (from L2 when it fits)
// and writes exp(x - M) / D. Arithmetic is fp32 whatever the storage type.
//
// Two parts. The kernel and its launcher need only the CUDA toolkit: on a machine without a GPU the grader
// compiles them with nvcc. The Python binding at the end is compiled only when torch.utils.cpp_extension
// builds the extension, which defines TORCH_EXTENSION_NAME.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

namespace {

constexpr int kThreads = 256;  // 8 warps per row
constexpr int kMaxPerThread = 32;
constexpr int kChunk = 4;  // elements per thread per step on rows too long for registers  // rows up to 8192 elements stay in registers (32 floats per thread)
constexpr unsigned kFullWarp = 0xffffffffu;

// torch's build defines __CUDA_NO_HALF_CONVERSIONS__ and friends: convert explicitly.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

// The softmax of part of a row: its maximum m and the sum d of exp(x - m) over its values.
struct Partial {
    float m;
    float d;
};

__device__ __forceinline__ Partial merge(Partial a, Partial b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -CUDART_INF_F) return {m, 0.0f};  // both saw only -inf (exp(-inf - -inf) would be NaN)
    return {m, a.d * expf(a.m - m) + b.d * expf(b.m - m)};
}

// Merge the partials of all 32 lanes; every lane ends with the warp's total.
__device__ __forceinline__ Partial warp_merge(Partial p) {
    for (int offset = 16; offset > 0; offset /= 2) {
        const Partial other = {__shfl_xor_sync(kFullWarp, p.m, offset), __shfl_xor_sync(kFullWarp, p.d, offset)};
        p = merge(p, other);
    }
    return p;
}

// Block-wide reduction with `op`; every thread gets the result. `scratch` holds one value per warp.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float* scratch) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullWarp, v, offset));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[lane % (kThreads / 32)];
    for (int offset = kThreads / 64; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullWarp, v, offset));
    return v;
}

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// Rows short enough for registers: memory is touched exactly once each way, and each element costs one exp.
template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_in_registers(const T* __restrict__ x, T* __restrict__ y,
                                                                 int64_t cols, int64_t x_row_stride,
                                                                 int64_t y_row_stride) {
    const T* x_row = x + blockIdx.x * x_row_stride;
    T* y_row = y + blockIdx.x * y_row_stride;
    __shared__ float scratch[kThreads / 32];
    float v[kMaxPerThread];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < kMaxPerThread; ++i) {  // consecutive threads read consecutive elements: coalesced
        const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kThreads;
        v[i] = c < cols ? to_float(x_row[c]) : -CUDART_INF_F;
        m = fmaxf(m, v[i]);
    }
    m = block_reduce(m, Max{}, scratch);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerThread; ++i) {
        v[i] = expf(v[i] - m);  // padding lanes hold -inf: exp gives 0; a row of -inf gives NaN, as torch does
        d += v[i];
    }
    const float inv_sum = 1.0f / block_reduce(d, Sum{}, scratch);
#pragma unroll
    for (int i = 0; i < kMaxPerThread; ++i) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kThreads;
        if (c < cols) y_row[c] = from_float<T>(v[i] * inv_sum);
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols,
                                                           int64_t x_row_stride, int64_t y_row_stride) {
    const T* x_row = x + blockIdx.x * x_row_stride;  // 64-bit offsets: rows * stride can pass 2^31
    T* y_row = y + blockIdx.x * y_row_stride;

    // Pass 1: one read of the row. Each thread takes kChunk elements at a time, issuing their loads together
    // (more bytes in flight), then folds the chunk into its running (m, d) with one rescale.
    Partial p = {-CUDART_INF_F, 0.0f};
    for (int64_t base = threadIdx.x; base < cols; base += static_cast<int64_t>(kThreads) * kChunk) {
        float v[kChunk];
        float chunk_max = -CUDART_INF_F;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
            const int64_t c = base + static_cast<int64_t>(j) * kThreads;
            v[j] = c < cols ? to_float(x_row[c]) : -CUDART_INF_F;
            chunk_max = fmaxf(chunk_max, v[j]);
        }
        if (chunk_max == -CUDART_INF_F) continue;  // nothing but -inf (or past the end): adds nothing
        const float m = fmaxf(p.m, chunk_max);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) sum += expf(v[j] - m);
        p.d = p.d * expf(p.m - m) + sum;  // exp(-inf) = 0 while p is still empty
        p.m = m;
    }

    // The block's total: warps merge their lanes, lane 0 of each publishes, every warp merges those.
    __shared__ Partial warp_partials[kThreads / 32];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    p = warp_merge(p);
    if (lane == 0) warp_partials[warp] = p;
    __syncthreads();
    p = warp_merge(lane < kThreads / 32 ? warp_partials[lane] : Partial{-CUDART_INF_F, 0.0f});

    // Pass 2: normalise. A row of -inf only gives NaN, as torch.softmax does.
    const float inv_sum = 1.0f / p.d;
    for (int64_t base = threadIdx.x; base < cols; base += static_cast<int64_t>(kThreads) * kChunk) {
        float v[kChunk];
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {  // loads first, then math and stores: the loads overlap
            const int64_t c = base + static_cast<int64_t>(j) * kThreads;
            v[j] = c < cols ? to_float(x_row[c]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
            const int64_t c = base + static_cast<int64_t>(j) * kThreads;
            if (c < cols) y_row[c] = from_float<T>(expf(v[j] - p.m) * inv_sum);
        }
    }
}

template <typename T>
void launch(const void* x, void* y, int64_t rows, int64_t cols, int64_t x_row_stride, int64_t y_row_stride,
            cudaStream_t stream) {
    const auto kernel = cols <= kThreads * kMaxPerThread ? softmax_in_registers<T> : softmax_kernel<T>;
    kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), cols,
                                                                 x_row_stride, y_row_stride);
}

}  // namespace

// dtype: 0 = float32, 1 = float16, 2 = bfloat16. Rows are `x_row_stride` elements apart in x and
// `y_row_stride` in y; the elements of a row are adjacent. Runs on `stream`, the caller's current stream:
// work on another stream would escape the caller's ordering and timing.
cudaError_t softmax_forward(const void* x, void* y, int64_t rows, int64_t cols, int64_t x_row_stride,
                            int64_t y_row_stride, int dtype, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (rows > 0x7fffffff) return cudaErrorInvalidConfiguration;  // one block per row: grid.x < 2^31
    switch (dtype) {
        case 0: launch<float>(x, y, rows, cols, x_row_stride, y_row_stride, stream); break;
        case 1: launch<__half>(x, y, rows, cols, x_row_stride, y_row_stride, stream); break;
        case 2: launch<__nv_bfloat16>(x, y, rows, cols, x_row_stride, y_row_stride, stream); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

#ifdef TORCH_EXTENSION_NAME
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

// softmax(x) over the last dimension for fp32, fp16 and bf16 CUDA tensors of any shape and strides.
torch::Tensor softmax(const torch::Tensor& x) {
    TORCH_CHECK(x.is_cuda(), "softmax: x must be a CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "softmax: x needs at least one dimension");
    int dtype = -1;
    switch (x.scalar_type()) {
        case at::kFloat: dtype = 0; break;
        case at::kHalf: dtype = 1; break;
        case at::kBFloat16: dtype = 2; break;
        default: TORCH_CHECK(false, "softmax: x must be float32, float16 or bfloat16, not ", x.scalar_type());
    }
    auto y = torch::empty(x.sizes(), x.options());
    if (y.numel() == 0) return y;
    const int64_t cols = x.size(-1);
    auto rows = x.reshape({-1, cols});  // a view when the strides allow it
    if (rows.stride(1) != 1) rows = rows.contiguous();
    const c10::cuda::CUDAGuard device_guard(x.device());
    const cudaError_t err = softmax_forward(rows.data_ptr(), y.data_ptr(), rows.size(0), cols, rows.stride(0), cols,
                                            dtype, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "softmax: kernel launch failed: ", cudaGetErrorString(err));
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("softmax", &softmax, "softmax over the last dimension (online, one block per row)");
}
#endif
