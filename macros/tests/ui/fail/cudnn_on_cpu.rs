#[backends::sdpa_kernel(cudnn, device = cpu)]
fn attend() {}

fn main() {
    attend();
}
