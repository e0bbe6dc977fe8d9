#[backends::sdpa_kernel(cudnn, mask = bool)]
fn attend() {}

fn main() {
    attend();
}
