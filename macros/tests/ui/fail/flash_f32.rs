#[backends::sdpa_kernel(flash, dtype = f32)]
fn attend() {}

fn main() {
    attend();
}
