// Row softmax for the math attention path: y[r, :] = softmax(x[r, :] * scale) in fp32.
// A row whose entries are all -inf gives NaN, as PyTorch's softmax does.
//
// Specialisation: alias T (f32, or f16 with shader-f16).
// Dispatch: (rows, 1, 1); one 64-invocation workgroup per row.

struct Params { rows: u32, cols: u32, scale: f32, pad: u32 }

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> partial: array<f32, 64>;

fn reduce(value: f32, tid: u32, take_max: bool) -> f32 {
    partial[tid] = value;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride >>= 1u) {
        if (tid < stride) {
            let other = partial[tid + stride];
            if (take_max) { partial[tid] = max(partial[tid], other); } else { partial[tid] += other; }
        }
        workgroupBarrier();
    }
    let result = partial[0];
    workgroupBarrier();
    return result;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let base = wg.x * p.cols;
    var m = -3.4028234e38;
    var any_finite = false;
    for (var c = tid; c < p.cols; c += 64u) {
        let s = f32(x[base + c]) * p.scale;
        m = max(m, s);
    }
    m = reduce(m, tid, true);
    var sum = 0.0;
    for (var c = tid; c < p.cols; c += 64u) { sum += exp(f32(x[base + c]) * p.scale - m); }
    sum = reduce(sum, tid, false);
    for (var c = tid; c < p.cols; c += 64u) {
        y[base + c] = T(exp(f32(x[base + c]) * p.scale - m) / sum);
    }
}
