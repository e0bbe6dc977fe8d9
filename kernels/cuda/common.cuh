// Shared by every CUDA kernel family; prepended once to each family's compile unit.
// Header-free on purpose: NVRTC needs no include path, at build time or at run time.
// 16-bit types are plain bit patterns; conversions and tensor-core MMAs are inline PTX.

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(half_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_f32(bf16_t x) { return __uint_as_float(((unsigned)x.bits) << 16); }

template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ half_t from_f32<half_t>(float x) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
    return h;
}
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
    bf16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
    return h;
}

// Rounds an fp32 value to the nearest value with a bf16 mantissa, or a TF32 one.
__device__ __forceinline__ float round_bf16(float x) { return to_f32(from_f32<bf16_t>(x)); }
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// Two 16-bit values in one register, `lo` in the low half (the lower k index).
__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}
template <class T> __device__ __forceinline__ unsigned pack2f(float lo, float hi) {
    return pack2(from_f32<T>(lo).bits, from_f32<T>(hi).bits);
}

// D = A * B + C on one warp. Fragment layouts (PTX ISA, "mma.m16n8k16" / "mma.m16n8k8"):
// with g = lane / 4 and t = lane % 4, C/D hold rows g and g + 8, columns 2t and 2t + 1.
__device__ __forceinline__ void mma_f16_f32(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16_f32(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_f16_f16(unsigned d[2], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
        : "+r"(d[0]), "+r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_tf32_f32(float d[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

#define NEG_INF (-__int_as_float(0x7f800000))

// 16 bytes moved by one vector load and one vector store (both addresses 16-byte aligned).
struct __align__(16) bytes16 { unsigned x, y, z, w; };
__device__ __forceinline__ void copy16(void* dst, const void* src) {
    *reinterpret_cast<bytes16*>(dst) = *reinterpret_cast<const bytes16*>(src);
}
__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

// Whether dropout keeps attention weight `index` (its flat [B, H, Lq, Lk] index): the
// host's stateless splitmix64 decision, so a seed drops the same weights on every device.
__device__ __forceinline__ bool dropout_keep(unsigned long long seed, unsigned long long index, double p) {
    unsigned long long z = seed ^ (index * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0) >= p;
}

// A 16-bit tensor-core MMA chosen by element type (the last argument is only a tag).
__device__ __forceinline__ void mma_16(float d[4], const unsigned a[4], const unsigned b[2], half_t) {
    mma_f16_f32(d, a, b);
}
__device__ __forceinline__ void mma_16(float d[4], const unsigned a[4], const unsigned b[2], bf16_t) {
    mma_bf16_f32(d, a, b);
}
