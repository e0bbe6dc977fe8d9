// A strided view of 4-byte elements copied into a contiguous buffer: dst[i] = src[offset +
// sum_d index_d(i) * stride_d], index(i) being i's row-major index over `shape` (8
// dimensions, unused leading ones of size 1 and stride 0). Elements move as u32 words.
//
// Specialisation: none beyond the element type alias (unused: words are copied).
// Dispatch: (groups_x, ceil(ceil(n / 256) / groups_x), 1), 256 invocations per workgroup.

struct Params {
    n: u32, offset: u32, groups_x: u32, pad: u32,
    shape: array<vec4<u32>, 2>,
    stride: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (i >= p.n) { return; }
    var rest = i;
    var at = p.offset;
    for (var d = 7; d >= 0; d--) {
        let size = p.shape[d / 4][d % 4];
        at += (rest % size) * p.stride[d / 4][d % 4];
        rest = rest / size;
    }
    dst[i] = src[at];
}
