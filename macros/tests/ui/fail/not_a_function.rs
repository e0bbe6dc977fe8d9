#[backends::sdpa_kernel(math)]
struct Attention;

fn main() {}
