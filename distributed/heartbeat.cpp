// The ranks' heartbeats over TCP, and the verdict on a lost, failed or silent peer. See heartbeat.h.
#include "heartbeat.h"
#include "stop_signals.h"  // kExitStopped, kExitStoppedUnsaved: a goodbye with either is an orderly end
#include "../kernels/die.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace {

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Every message is 16 bytes: what it is, and its fields.
struct Message {
    int32_t kind, rank, problem, number;
};
enum : int32_t { kHello = 1, kBeat, kGoodbye, kNotice };  // kHello: rank; kGoodbye: number = exit status; kNotice: below
enum : int32_t { kLost = 1, kFailed, kSilent };           // a notice's problem with `rank`; number: the status or the seconds

std::string problem_text(int32_t rank, int32_t problem, int32_t number) {
    const std::string who = "rank " + std::to_string(rank);
    if (problem == kLost) return who + " was lost: its process ended without a goodbye (killed or crashed)";
    if (problem == kFailed) return who + " exited with status " + std::to_string(number);
    return who + " is silent: no heartbeat for " + std::to_string(number) + " s (stopped, frozen or unreachable)";
}

// One connection: to rank 0, or (on rank 0) to one of the others.
struct Peer {
    int fd = -1;  // -1 once closed
    int rank = 0;
    double last_heard = 0;
    bool departed = false;  // said goodbye
    std::string received;   // bytes of a message not yet complete
};

class Heartbeats {
public:
    Heartbeats(int rank, int silent_seconds, std::vector<Peer> peers)
        : rank_(rank), silent_seconds_(silent_seconds), period_(std::min(1.0, silent_seconds / 5.0)), peers_(std::move(peers)) {}

    // The heartbeat thread: reads what the peers send, sends this rank's heartbeat every period, watches for
    // silence, and ends the process two seconds after a verdict if the main thread has not.
    void run() {
        double next_beat = 0;
        std::vector<pollfd> fds;
        std::vector<Peer*> polled;
        while (!leaving_.load()) {
            fds.clear();
            polled.clear();
            for (Peer& p : peers_)
                if (p.fd >= 0) {
                    fds.push_back({p.fd, POLLIN, 0});
                    polled.push_back(&p);
                }
            if (poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const double now = now_seconds();
            for (size_t i = 0; i < fds.size(); i++)
                if (fds[i].revents != 0) receive(*polled[i], now);
            if (now >= next_beat) {
                for (Peer& p : peers_) send_to(p, {kBeat, rank_, 0, 0});
                next_beat = now + period_;
            }
            for (Peer& p : peers_)
                if (p.fd >= 0 && !p.departed && now - p.last_heard > silent_seconds_) found(p.rank, kSilent, (int32_t)(now - p.last_heard));
            std::unique_lock<std::mutex> lock(verdict_mutex_);
            if (!verdict_.empty() && now - verdict_time_ >= 2.0 && !leaving_.load() && claim_process_end()) {
                print_error("rank " + std::to_string(rank_) + ": " + verdict_);
                _exit(EXIT_FAILURE);
            }
        }
    }

    // At exit (on_exit): every peer hears this rank's exit status; no verdict is taken from here on.
    void say_goodbye(int status) {
        leaving_.store(true);
        for (Peer& p : peers_) send_to(p, {kGoodbye, rank_, 0, status});
    }

    std::string verdict(double wait_seconds) {
        std::unique_lock<std::mutex> lock(verdict_mutex_);
        if (wait_seconds > 0)
            verdict_ready_.wait_for(lock, std::chrono::duration<double>(wait_seconds), [this] { return !verdict_.empty(); });
        return verdict_;
    }

private:
    // Sends without blocking (a stopped peer reads nothing) and without SIGPIPE (a peer gone).
    void send_to(Peer& p, const Message& m) {
        std::lock_guard<std::mutex> lock(send_mutex_);
        if (p.fd >= 0) (void)send(p.fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
    }

    void receive(Peer& p, double now) {
        char buffer[4096];
        bool closed = false;
        for (;;) {
            const ssize_t got = recv(p.fd, buffer, sizeof buffer, MSG_DONTWAIT);
            if (got > 0) {
                p.received.append(buffer, (size_t)got);
                continue;
            }
            if (got < 0 && errno == EINTR) continue;
            closed = got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
            break;
        }
        // the messages before the end of the connection first: a goodbye, then the close, is an orderly exit
        size_t at = 0;
        for (; p.received.size() - at >= sizeof(Message); at += sizeof(Message)) {
            Message m;
            memcpy(&m, p.received.data() + at, sizeof m);
            p.last_heard = now;
            if (m.kind == kGoodbye) {
                p.departed = true;
                if (m.number != 0 && m.number != kExitStopped && m.number != kExitStoppedUnsaved) found(p.rank, kFailed, m.number);
            } else if (m.kind == kNotice && rank_ != 0) {
                set_verdict(problem_text(m.rank, m.problem, m.number) + ", as rank 0 reports");
            }
        }
        p.received.erase(0, at);
        if (!closed) return;
        {
            std::lock_guard<std::mutex> lock(send_mutex_);
            close(p.fd);
            p.fd = -1;
        }
        if (!p.departed) found(p.rank, kLost, 0);
    }

    // A problem with peer `culprit`: the verdict if it is the first. Rank 0 tells every other rank before the verdict
    // is out: once out, the main thread may end this process at once, and the others would then hear only rank 0's
    // connection close.
    void found(int32_t culprit, int32_t problem, int32_t number) {
        if (leaving_.load()) return;
        set_verdict(problem_text(culprit, problem, number), [&] {
            if (rank_ == 0)
                for (Peer& p : peers_)
                    if (p.rank != culprit) send_to(p, {kNotice, culprit, problem, number});
        });
    }

    // Sets the verdict if there is none yet, after `before_publishing` (under the lock: only the first verdict's).
    void set_verdict(const std::string& text, const std::function<void()>& before_publishing = [] {}) {
        std::lock_guard<std::mutex> lock(verdict_mutex_);
        if (!verdict_.empty()) return;
        before_publishing();
        verdict_ = text;
        verdict_time_ = now_seconds();
        verdict_ready_.notify_all();
    }

    const int rank_, silent_seconds_;
    const double period_;     // between heartbeats: a fifth of the silence timeout, at most a second
    std::vector<Peer> peers_;  // fixed after start; fd and departed change under send_mutex_ / on this thread
    std::atomic<bool> leaving_{false};
    std::mutex send_mutex_, verdict_mutex_;
    std::condition_variable verdict_ready_;
    std::string verdict_;
    double verdict_time_ = 0;
};

int g_listener = -1;                             // rank 0's listening socket, until the others connected
std::atomic<Heartbeats*> g_heartbeats{nullptr};  // never deleted: the thread and the exit hook use it to the end
std::atomic<bool> g_process_ending{false};

void say_goodbye(int status, void*) {
    if (Heartbeats* h = g_heartbeats.load()) h->say_goodbye(status);
}

void send_exact(int fd, const Message& m, const std::string& what) {
    const char* p = reinterpret_cast<const char*>(&m);
    for (size_t left = sizeof m; left > 0;) {
        const ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("heartbeats: " + what + ": " + strerror(errno));
        p += n;
        left -= (size_t)n;
    }
}

bool receive_exact(int fd, Message& m) {
    char* p = reinterpret_cast<char*>(&m);
    for (size_t left = sizeof m; left > 0;) {
        const ssize_t n = recv(fd, p, left, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        left -= (size_t)n;
    }
    return true;
}

}  // namespace

HeartbeatAddress heartbeat_listen() {
    HeartbeatAddress address;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die(std::string("heartbeats: socket: ") + strerror(errno));
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = 0;  // any free port
    socklen_t length = sizeof addr;
    if (bind(fd, (sockaddr*)&addr, sizeof addr) != 0 || listen(fd, 1024) != 0 || getsockname(fd, (sockaddr*)&addr, &length) != 0)
        die(std::string("heartbeats: cannot listen on a TCP port: ") + strerror(errno));
    address.port = ntohs(addr.sin_port);
    if (gethostname(address.host, sizeof address.host - 1) != 0) die(std::string("heartbeats: gethostname: ") + strerror(errno));
    g_listener = fd;
    return address;
}

void heartbeat_start(int rank, int world, const std::string& host, int port, int silent_seconds) {
    std::vector<Peer> peers;
    if (rank == 0) {
        if (g_listener < 0) die("internal: heartbeat_start on rank 0 before heartbeat_listen");
        std::vector<bool> seen(world, false);
        for (int i = 1; i < world; i++) {
            const int fd = accept4(g_listener, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0 && errno == EINTR) {
                i--;
                continue;
            }
            if (fd < 0) die(std::string("heartbeats: accept: ") + strerror(errno));
            Message hello;
            if (!receive_exact(fd, hello) || hello.kind != kHello || hello.rank < 1 || hello.rank >= world || seen[hello.rank])
                die("heartbeats: a connection that is not one of the " + std::to_string(world - 1) + " other ranks (port " +
                    std::to_string(port) + ")");
            seen[hello.rank] = true;
            Peer p;
            p.fd = fd;
            p.rank = hello.rank;
            peers.push_back(p);
        }
    } else {
        addrinfo hints = {}, *found = nullptr;
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr)
            die("heartbeats: cannot resolve rank 0's host " + host);
        int fd = -1;
        for (;;) {  // the caller's watchdog bounds this loop
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) break;
            if (fd >= 0) close(fd);
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        freeaddrinfo(found);
        send_exact(fd, {kHello, rank, 0, 0}, "cannot greet rank 0 at " + host + ":" + std::to_string(port));
        Peer p;
        p.fd = fd;
        peers.push_back(p);
    }
    if (g_listener >= 0) close(g_listener);  // rank 0's, done; or one a forked test rank inherited
    g_listener = -1;
    const double now = now_seconds();
    for (Peer& p : peers) p.last_heard = now;
    Heartbeats* h = new Heartbeats(rank, silent_seconds, std::move(peers));
    g_heartbeats.store(h);
    on_exit(say_goodbye, nullptr);
    std::thread([h] { h->run(); }).detach();
}

std::string heartbeat_verdict() {
    Heartbeats* h = g_heartbeats.load();
    return h ? h->verdict(0) : std::string();
}

std::string heartbeat_wait_for_verdict(double seconds) {
    Heartbeats* h = g_heartbeats.load();
    return h ? h->verdict(seconds) : std::string();
}

bool claim_process_end() { return !g_process_ending.exchange(true); }
