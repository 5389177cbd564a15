/* The course's compiled loop (week 1): the same in-order sum as the handout's Python loop_sum, compiled by
   the system C compiler. The grader times it as the compiled baseline; learners write their own. */
double loop_sum(const double *values, long n) {
    double total = 0.0;
    for (long i = 0; i < n; i++) {
        total += values[i];
    }
    return total;
}
