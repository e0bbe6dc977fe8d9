#[backends::sdpa_kernel(mem_efficient, dtype = bf16, device = wgpu)]
fn attend() {}

fn main() {
    attend();
}
