#[backends::sdpa_kernel(math, causal, mask = float)]
fn attend() {}

fn main() {
    attend();
}
