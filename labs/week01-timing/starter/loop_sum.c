/* Week 1: the Python loop_sum, compiled. benchmark.measure_compiled builds this file with
   `cc -O2 -shared -fPIC -o loop_sum.so loop_sum.c` and calls it through ctypes. */
double loop_sum(const double *values, long n) {
    /* TODO(week01): add values[0] .. values[n - 1] in order into a double and return the total. */
    (void)values;
    (void)n;
    return 0.0;
}
