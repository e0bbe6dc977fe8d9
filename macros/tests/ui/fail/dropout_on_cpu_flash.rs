#[backends::sdpa_kernel(flash, dropout, device = cpu)]
fn attend() {}

fn main() {
    attend();
}
