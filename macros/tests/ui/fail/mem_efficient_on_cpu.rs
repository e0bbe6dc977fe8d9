#[backends::sdpa_kernel(math, mem_efficient, device = cpu)]
fn attend() {}

fn main() {
    attend();
}
