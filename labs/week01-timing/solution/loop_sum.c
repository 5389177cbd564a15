/* Week 1: the Python loop_sum, compiled (reference solution). Same order of additions as the Python loop, so
   the same result to the last bit; built with `cc -O2 -shared -fPIC` by benchmark.measure_compiled. */
double loop_sum(const double *values, long n) {
    double total = 0.0;
    for (long i = 0; i < n; i++) {
        total += values[i];
    }
    return total;
}
