#[backends::sdpa_kernel(causal, dtype = bf16)]
fn attend() {}

fn main() {
    attend();
}
