#[backends::sdpa_kernel(mem_efficient, dtype = f16, head_dim = 36)]
fn attend() {}

fn main() {
    attend();
}
