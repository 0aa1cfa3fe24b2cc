// Private mounts for the tests of full disks and file systems without direct I/O: a file system mounted for this
// process alone, in its own user and mount namespaces (as `unshare -rm`).
// defines: mount_private
#pragma once
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

// Mounts `type` with `options` on `dir` for this process alone (own user and mount namespaces, as `unshare -rm`; as
// root without user namespaces, a mount namespace alone): "" or why not.
inline std::string mount_private(const std::string& dir, const char* type, const std::string& options, unsigned long flags = 0) {
    static bool entered = false;
    if (!entered) {
        const unsigned uid = getuid(), gid = getgid();
        auto write_text = [](const char* path, const std::string& text) {
            FILE* out = fopen(path, "w");
            const bool ok = out != nullptr && fputs(text.c_str(), out) >= 0;
            return out != nullptr && fclose(out) == 0 && ok;
        };
        if (unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0) {
            if (!write_text("/proc/self/setgroups", "deny") || !write_text("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
                !write_text("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
                return std::string("cannot map the user into its namespace: ") + strerror(errno);
        } else if (unshare(CLONE_NEWNS) != 0) {
            return std::string("no user or mount namespace for this process (unshare: ") + strerror(errno) + ")";
        }
        if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return std::string("cannot make the mounts private: ") + strerror(errno);
        entered = true;
    }
    if (mount(type, dir.c_str(), type, flags, options.c_str()) != 0) return std::string("cannot mount a ") + type + ": " + strerror(errno);
    return "";
}
