#[backends::sdpa_kernel(flash, head_dim = 512)]
fn attend() {}

fn main() {
    attend();
}
