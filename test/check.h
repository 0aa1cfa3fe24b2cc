// The tests' output protocol and error measures. Each check prints one line, "PASS name  detail" or
// "FAIL name: detail", which test/run_tests.sh counts; a test program exits 1 if any check failed.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

inline int& check_failures() {
    static int failures = 0;
    return failures;
}
inline void check(bool ok, const std::string& name, const std::string& detail) {
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), ok ? "  " : ": ", detail.c_str());
    fflush(stdout);
    if (!ok) check_failures()++;
}

// ||a - b|| / ||b||; infinite when a holds a NaN or inf (an unwritten, poisoned output included).
inline double relative_l2(const float* a, const float* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(a[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return std::sqrt(num / den);
}
