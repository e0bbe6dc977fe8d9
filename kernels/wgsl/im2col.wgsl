// A convolution's input unfolded for its GEMM (im2col), 4-byte elements moved as u32
// words: for images [count, C, H, W], dst is [count, C, kH, kW, H', W'], zero where a tap
// falls in the padding (see kernels/cuda/im2col.cu).
//
// Specialisation: none beyond the element type alias (unused: words are copied).
// Dispatch: (groups_x, ceil(ceil(n / 256) / groups_x), 1), 256 invocations per workgroup.

struct Params {
    n: u32, offset: u32, height: u32, width: u32,
    out_h: u32, out_w: u32, kh: u32, kw: u32,
    stride_h: u32, stride_w: u32, pad_h: u32, pad_w: u32,
    dil_h: u32, dil_w: u32, groups_x: u32, pad: u32,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (i >= p.n) { return; }
    let pixels = p.out_h * p.out_w;
    let pixel = i % pixels;
    let row = i / pixels;
    let taps = p.kh * p.kw;
    let tap = row % taps;
    let plane = row / taps;
    let iy = i32(pixel / p.out_w * p.stride_h + tap / p.kw * p.dil_h) - i32(p.pad_h);
    let ix = i32(pixel % p.out_w * p.stride_w + tap % p.kw * p.dil_w) - i32(p.pad_w);
    var value = 0u;
    if (iy >= 0 && iy < i32(p.height) && ix >= 0 && ix < i32(p.width)) {
        value = src[p.offset + (plane * p.height + u32(iy)) * p.width + u32(ix)];
    }
    dst[i] = value;
}
