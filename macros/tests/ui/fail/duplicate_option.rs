#[backends::sdpa_kernel(math, causal, causal)]
fn attend() {}

fn main() {
    attend();
}
