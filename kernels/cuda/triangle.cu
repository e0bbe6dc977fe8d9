// Keeps one triangle of each `rows` x `cols` matrix of a contiguous batch in place and
// zeroes the rest: with keep_upper the elements on and above the diagonal (shifted right
// by `diagonal`: column - row >= diagonal is kept), else those on and below it (column -
// row <= diagonal). With unit_diagonal the main diagonal is set to 1 (the unit lower factor
// of an LU decomposition). The triangular factors linear algebra returns on CUDA.
//
// Specialisation: KERNEL, T (float or double).
// Launch: grid ceil(n / 256), block 256.

extern "C" __global__ void __launch_bounds__(256) KERNEL(
    T* __restrict__ x, long long n, long long rows, long long cols, long long diagonal,
    int keep_upper, int unit_diagonal)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long column = i % cols;
    const long long row = i / cols % rows;
    const long long offset = column - row;
    const bool kept = keep_upper ? offset >= diagonal : offset <= diagonal;
    if (!kept) {
        x[i] = (T)0;
    } else if (unit_diagonal && offset == 0) {
        x[i] = (T)1;
    }
}
