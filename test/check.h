// The tests' output protocol and error measures (what each suite checks is in its own test_X.cpp|cu). Each check
// prints one line, "PASS suite name  detail", "FAIL suite name: detail" or "SKIP suite name: why", which
// test/run_tests.sh counts; suite is the program's suite name (build/test_X: X), set once with check_suite() at
// the start of main. A test program exits 1 if any check failed.
#pragma once
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

inline int& check_failures() {
    static int failures = 0;
    return failures;
}
// The suite name every check line starts with (test/run_tests.sh's label for this program).
inline std::string& check_suite_name() {
    static std::string suite = "unnamed";
    return suite;
}
inline void check_suite(const std::string& suite) { check_suite_name() = suite; }
inline void check(bool ok, const std::string& name, const std::string& detail) {
    printf("%s %s %s%s%s\n", ok ? "PASS" : "FAIL", check_suite_name().c_str(), name.c_str(), ok ? "  " : ": ",
           detail.c_str());
    fflush(stdout);
    if (!ok) check_failures()++;
}

// The test tier, TEST_TIER (test/run_tests.sh): "quick" runs a program's reduced set of cases; "full", or no
// TEST_TIER (a program run by hand), all of them.
inline bool quick_tier() {
    const char* tier = getenv("TEST_TIER");
    return tier != nullptr && strcmp(tier, "quick") == 0;
}

// What `body` printed on stderr when it ended its own process, run in a child (a refusal: die() exits 1): "" if
// `body` returned, else its stderr ("ended without a message" if empty).
inline std::string refusal(const std::function<void()>& body) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    fflush(stdout);
    fflush(stderr);
    const pid_t child = fork();
    if (child < 0) return "fork failed";
    if (child == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        body();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, (size_t)n);
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    return err.empty() ? "ended without a message" : err;
}
inline void pass(const std::string& name) { check(true, name, ""); }
inline void fail(const std::string& name, const std::string& detail) { check(false, name, detail); }
// Like check(), but the detail describes a failure and is printed only then.
inline void expect(bool ok, const std::string& name, const std::string& detail) { check(ok, name, ok ? "" : detail); }
inline void skip(const std::string& name, const std::string& why) {
    printf("SKIP %s %s: %s\n", check_suite_name().c_str(), name.c_str(), why.c_str());
    fflush(stdout);
}
// Runs body(); an exception it throws is a failure of `name`.
inline void guarded(const std::string& name, const std::function<void()>& body) {
    try {
        body();
    } catch (const std::exception& e) {
        fail(name, std::string("exception: ") + e.what());
    }
}
inline bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
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

// Formats up to three numbers into a detail string.
inline std::string fmt(const char* format, double a, double b = 0.0, double c = 0.0) {
    char buf[200];
    snprintf(buf, sizeof buf, format, a, b, c);
    return buf;
}
// One check line for a tensor's relative L2 error, and for a scalar's relative error.
inline void check_rel_l2(const std::string& name, const float* ours, const float* ref, size_t n, double tol) {
    const double err = relative_l2(ours, ref, n);
    check(err <= tol, name, fmt("relative L2 error %.3e (tolerance %.0e)", err, tol));
}
inline void check_scalar(const std::string& name, double ours, double ref, double tol) {
    const double err = std::fabs(ours - ref) / std::fabs(ref);
    check(err <= tol, name, fmt("relative error %.3e (tolerance %.0e), ours %.8g", err, tol, ours) + fmt(", reference %.8g", ref));
}
