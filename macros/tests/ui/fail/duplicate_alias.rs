#[backends::sdpa_kernel(mem_efficient, efficient)]
fn attend() {}

fn main() {
    attend();
}
