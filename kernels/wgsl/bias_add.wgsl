// Adds a per-channel bias in place: x[i] += bias[(i / inner) % channels], for x laid out
// [outer, channels, inner] (see kernels/cuda/bias_add.cu).
//
// Specialisation: T (f32).
// Dispatch: (groups_x, ceil(ceil(n / 256) / groups_x), 1), 256 invocations per workgroup.

struct Params {
    n: u32, inner: u32, channels: u32, groups_x: u32,
    x_offset: u32, bias_offset: u32, pad0: u32, pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<T>;
@group(0) @binding(1) var<storage, read> bias: array<T>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = (wg.y * p.groups_x + wg.x) * 256u + tid;
    if (i >= p.n) { return; }
    let at = p.x_offset + i;
    x[at] = x[at] + bias[p.bias_offset + i / p.inner % p.channels];
}
