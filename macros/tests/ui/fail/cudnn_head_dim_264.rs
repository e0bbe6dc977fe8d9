#[backends::sdpa_kernel(cudnn, head_dim = 264)]
fn attend() {}

fn main() {
    attend();
}
