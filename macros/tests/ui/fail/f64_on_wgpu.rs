#[backends::sdpa_kernel(mem_efficient, dtype = f64, device = wgpu)]
fn attend() {}

fn main() {
    attend();
}
