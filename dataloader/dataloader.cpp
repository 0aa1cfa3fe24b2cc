// DataLoader: shard discovery, the (optionally shuffled) batch order, window reads, and the read-ahead thread.
// The order and the format are documented in dataloader.h and docs/formats.md; the shard files themselves are
// read and validated by shards.cpp. What a batch is used for (upload to the GPU, the loss) is the trainer's.
//
// Threads: with prefetch_depth > 0 one reader thread fills slots ahead of the consumer. A slot is in exactly
// one of three places: `free_` (the reader may fill it), `ready_` (filled, in batch order), or `held_` (the
// batch the caller was last given, valid until its next call to next()). Positions advance on the reader's
// copy (reader_pos_); each slot records the position after its batch, which becomes the consumer's position
// when it is served, so state() always describes what the caller has seen, not what was read ahead.
#include "dataloader.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <stdexcept>

#include "shards.h"

namespace {

constexpr uint32_t kStateMagic = 0x4C444C44;  // "DLDL"
constexpr uint32_t kStateVersion = 1;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("DataLoader: " + what); }

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A permutation of 0..n-1 that depends only on (seed, epoch, stream): Fisher-Yates driven by SplitMix64
// with unbiased bounded draws. Written out rather than std::shuffle, whose output differs between standard
// libraries, so runs (and resumes) are reproducible everywhere.
std::vector<uint32_t> permutation(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t stream) {
    uint64_t state = seed;
    state = splitmix64(state) ^ epoch;
    state = splitmix64(state) ^ stream;
    std::vector<uint32_t> p(n);
    std::iota(p.begin(), p.end(), 0u);
    for (uint64_t i = n; i > 1; --i) {
        const uint64_t reject_below = (0 - i) % i;  // 2^64 mod i: draws below it would bias the modulo
        uint64_t r;
        do r = splitmix64(state);
        while (r < reject_below);
        std::swap(p[i - 1], p[r % i]);
    }
    return p;
}

std::vector<std::string> glob_sorted(const std::string& pattern) {
    glob_t g;
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    if (rc == GLOB_NOMATCH) fail("no shard files match '" + pattern + "'");
    if (rc != 0) fail("cannot expand '" + pattern + "' (glob error " + std::to_string(rc) + ")");
    std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    std::sort(paths.begin(), paths.end());  // byte order, whatever the locale
    return paths;
}

}  // namespace

HostAllocator HostAllocator::system() {
    return {[](size_t bytes) { return std::malloc(bytes); }, [](void* p) { std::free(p); }};
}

DataLoader::DataLoader(const DataLoaderConfig& config) : config_(config) {
    const DataLoaderConfig& c = config_;
    if (c.B <= 0 || c.T <= 0)
        fail("B and T must be positive (got B=" + std::to_string(c.B) + ", T=" + std::to_string(c.T) + ")");
    if (c.num_ranks <= 0 || c.rank < 0 || c.rank >= c.num_ranks)
        fail("rank " + std::to_string(c.rank) + " is not in [0, num_ranks=" + std::to_string(c.num_ranks) + ")");
    if (c.prefetch_depth < 0) fail("prefetch_depth must be >= 0");
    if (c.vocab_size <= 0) fail("vocab_size must be positive");
    if (!c.allocator.allocate || !c.allocator.deallocate) fail("the host allocator needs both functions");

    shard_paths_ = glob_sorted(c.pattern);
    // a pattern such as X_train_* also matches the mask shards beside the shards: they are not shards
    shard_paths_.erase(std::remove_if(shard_paths_.begin(), shard_paths_.end(), is_mask_shard_path), shard_paths_.end());
    if (shard_paths_.empty()) fail("no shard files match '" + c.pattern + "', only mask shards");
    for (const std::string& path : shard_paths_) {
        shard_tokens_.push_back(ShardReader(path).num_tokens());
        num_tokens_ += shard_tokens_.back();
    }
    const uint64_t batch_tokens = uint64_t(c.num_ranks) * c.B * c.T + 1;
    open_masks();
    count_windows();
    if (batches_per_epoch_ == 0 && c.fit_to_data) {
        // the longest shard's tokens as whole rows of T for every rank, else one row as long as every rank can have
        const uint64_t longest = *std::max_element(shard_tokens_.begin(), shard_tokens_.end());
        const uint64_t room = longest > 0 ? longest - 1 : 0;
        const uint64_t rows = room / (uint64_t(c.num_ranks) * c.T);
        if (rows > 0) {
            config_.B = static_cast<int>(rows);  // below B: B rows did not fit
        } else if (has_masks_) {
            fail("the longest shard matching '" + c.pattern + "' holds " + std::to_string(longest) + " tokens, fewer than one window of T=" +
                 std::to_string(c.T) + " per rank (" + std::to_string(uint64_t(c.num_ranks) * c.T + 1) +
                 "): chat windows cannot be shortened; prepare more conversations or use fewer ranks");
        } else {
            config_.B = 1;
            config_.T = static_cast<int>(room / c.num_ranks);
        }
        if (config_.T > 0) count_windows();
    }
    if (batches_per_epoch_ == 0)
        fail("no shard matching '" + c.pattern + "' has the " + std::to_string(batch_tokens) + " tokens one batch needs (num_ranks*B*T + 1)" +
             (c.fit_to_data ? ", nor the " + std::to_string(c.num_ranks + 1) + " of one token per rank" : std::string()));
    if (shard_paths_.size() > UINT32_MAX) fail("too many shards");
    for (uint64_t windows : windows_per_shard_) window_counts_.emplace_back(has_masks_ ? windows : 0, UINT64_MAX);

    scratch_.resize(size_t(c.B) * c.T + 1);
    if (has_masks_) mask_scratch_.resize(size_t(c.B) * c.T);
    // inputs then targets, B*T each; the allocator is the trainer's (pinned memory, so uploads run asynchronously)
    const size_t bytes = 2 * size_t(c.B) * c.T * sizeof(int32_t);
    // prefetch_depth batches ahead plus the one the caller holds
    slots_.resize(c.prefetch_depth == 0 ? 1 : c.prefetch_depth + 1);
    try {
        for (Slot& slot : slots_) {
            slot.data = static_cast<int32_t*>(c.allocator.allocate(bytes));
            if (!slot.data) fail("host allocator returned null for " + std::to_string(bytes) + " bytes");
        }
    } catch (...) {  // the destructor will not run: give back what was allocated
        for (Slot& slot : slots_)
            if (slot.data) c.allocator.deallocate(slot.data);
        throw;
    }
    consumer_pos_ = first_position();
    start_reader();
}

DataLoader::~DataLoader() {
    stop_reader();
    for (Slot& slot : slots_) config_.allocator.deallocate(slot.data);
}

// Masks are all or nothing, each as long as its shard and laid out for this T.
void DataLoader::open_masks() {
    std::vector<bool> has(shard_paths_.size());
    for (size_t i = 0; i < shard_paths_.size(); ++i) has[i] = ::access(mask_shard_path(shard_paths_[i]).c_str(), F_OK) == 0;
    const auto with = std::find(has.begin(), has.end(), true), without = std::find(has.begin(), has.end(), false);
    if (with == has.end()) return;
    if (without != has.end())
        fail(shard_paths_[without - has.begin()] + " has no mask shard " + mask_shard_path(shard_paths_[without - has.begin()]) +
             " but " + shard_paths_[with - has.begin()] + " has one: chat data needs a mask beside every shard (prepare_shards --chat writes them)");
    has_masks_ = true;
    for (size_t i = 0; i < shard_paths_.size(); ++i) {
        const MaskReader mask(mask_shard_path(shard_paths_[i]));
        if (mask.num_tokens() != shard_tokens_[i])
            fail(mask.path() + ": " + std::to_string(mask.num_tokens()) + " mask bytes, but its shard " + shard_paths_[i] + " holds " +
                 std::to_string(shard_tokens_[i]) + " tokens (expected one byte a token)");
        if (mask.window() != config_.T)
            fail(mask.path() + ": laid out for windows of " + std::to_string(mask.window()) + " tokens (prepare_shards --chat --seq-len " +
                 std::to_string(mask.window()) + "), but T is " + std::to_string(config_.T) + " (expected --seq-len " +
                 std::to_string(mask.window()) + ")");
    }
}

// Windows of the current B x T in each shard: window k starts at k*G (G = num_ranks*B*T) and needs G+1 tokens.
void DataLoader::count_windows() {
    global_tokens_ = uint64_t(config_.num_ranks) * config_.B * config_.T;
    windows_per_shard_.clear();
    batches_per_epoch_ = 0;
    for (uint64_t n : shard_tokens_) {
        windows_per_shard_.push_back(n > global_tokens_ ? (n - 1) / global_tokens_ : 0);
        batches_per_epoch_ += windows_per_shard_.back();
    }
}

// ---- batch order ------------------------------------------------------------------------------------------

const std::vector<uint32_t>& DataLoader::shard_order(uint64_t epoch, OrderCache& cache) {
    const uint64_t key = config_.shuffle ? epoch : 0;  // unshuffled: one order for every epoch
    if (cache.shard_epoch != key) {
        if (config_.shuffle) {
            cache.shards = permutation(shard_paths_.size(), config_.seed, key, 0);
        } else {
            cache.shards.resize(shard_paths_.size());
            std::iota(cache.shards.begin(), cache.shards.end(), 0u);
        }
        cache.shard_epoch = key;
    }
    return cache.shards;
}

// Shuffled runs visit the windows of each shard in a permutation of their own (stream = shard + 1; stream 0 is the
// shard order), cached for the shard being read: it changes only once per shard.
const std::vector<uint32_t>& DataLoader::window_order(uint64_t epoch, uint32_t shard, OrderCache& cache) {
    if (cache.window_epoch != epoch || cache.window_shard != shard) {
        cache.windows = permutation(windows_per_shard_[shard], config_.seed, epoch, uint64_t(shard) + 1);
        cache.window_epoch = epoch;
        cache.window_shard = shard;
    }
    return cache.windows;
}

uint64_t DataLoader::window_of(const Position& pos, OrderCache& cache) {
    const uint32_t shard = shard_order(pos.epoch, cache)[pos.shard_pos];
    return config_.shuffle ? window_order(pos.epoch, shard, cache)[pos.window_pos] : pos.window_pos;
}

DataLoader::Position DataLoader::first_position() {
    Position pos;
    if (windows_per_shard_[shard_order(0, reader_order_)[0]] == 0) advance(pos, reader_order_);  // the first shard too short for a batch
    return pos;
}

// Next window; past a shard's last window, the next shard (in this epoch's order) that holds one.
void DataLoader::advance(Position& pos, OrderCache& cache) {
    ++pos.window_pos;
    while (pos.window_pos >= windows_per_shard_[shard_order(pos.epoch, cache)[pos.shard_pos]]) {
        pos.window_pos = 0;
        if (++pos.shard_pos == shard_paths_.size()) {
            pos.shard_pos = 0;
            ++pos.epoch;
        }
    }
}

const MaskReader& DataLoader::mask_of(uint32_t shard, OpenMask& open) {
    if (!open.reader || open.shard != shard) {
        open.reader.reset();
        open.reader = std::make_unique<MaskReader>(mask_shard_path(shard_paths_[shard]));
        if (open.reader->num_tokens() != shard_tokens_[shard])
            fail(open.reader->path() + " changed size since the loader was created");
        open.shard = shard;
    }
    return *open.reader;
}

void DataLoader::fill(Slot& slot, Position& pos) {
    const uint32_t shard = shard_order(pos.epoch, reader_order_)[pos.shard_pos];
    const uint64_t window = window_of(pos, reader_order_);
    const size_t rank_tokens = size_t(config_.B) * config_.T;
    const uint64_t first = window * global_tokens_ + uint64_t(config_.rank) * rank_tokens;
    // one shard open at a time: consecutive windows come from the same shard, so it is reopened once per shard
    if (!open_shard_ || open_shard_index_ != shard) {
        open_shard_.reset();
        auto reader = std::make_unique<ShardReader>(shard_paths_[shard]);
        if (reader->num_tokens() != shard_tokens_[shard])
            fail(shard_paths_[shard] + " changed size since the loader was created");
        open_shard_ = std::move(reader);
        open_shard_index_ = shard;
    }
    open_shard_->read(first, rank_tokens + 1, scratch_.data());
    check_token_ids(shard_paths_[shard], scratch_.data(), rank_tokens + 1, first, config_.vocab_size);
    // Rows overlap by one token, so the rank's B rows are one run of B*T+1 tokens: inputs are the run
    // without its last token, targets the run without its first.
    int32_t* inputs = slot.data;
    int32_t* targets = slot.data + rank_tokens;
    for (size_t i = 0; i < rank_tokens; ++i) {
        inputs[i] = scratch_[i];
        targets[i] = scratch_[i + 1];
    }
    if (has_masks_) {  // the targets' mask bytes: those of tokens first+1 .. first+rank_tokens
        mask_of(shard, open_mask_).read(first + 1, rank_tokens, mask_scratch_.data());
        for (size_t i = 0; i < rank_tokens; ++i)
            if (mask_scratch_[i] == 0) targets[i] = -1;
    }
    advance(pos, reader_order_);
    slot.after = pos;
}

uint64_t DataLoader::counted_targets_ahead(uint64_t batches) {
    if (!has_masks_) return batches * global_tokens_;
    Position pos = consumer_pos_;
    uint64_t total = 0;
    for (uint64_t b = 0; b < batches; ++b) {
        const uint32_t shard = shard_order(pos.epoch, lookahead_order_)[pos.shard_pos];
        const uint64_t window = window_of(pos, lookahead_order_);
        uint64_t& counted = window_counts_[shard][window];
        if (counted == UINT64_MAX) {  // the global window's targets: tokens window*G+1 .. window*G+G
            lookahead_bytes_.resize(global_tokens_);
            mask_of(shard, lookahead_mask_).read(window * global_tokens_ + 1, global_tokens_, lookahead_bytes_.data());
            counted = std::count(lookahead_bytes_.begin(), lookahead_bytes_.end(), uint8_t(1));
        }
        total += counted;
        advance(pos, lookahead_order_);
    }
    return total;
}

// ---- serving and read-ahead -------------------------------------------------------------------------------

Batch DataLoader::next() {
    const auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    const size_t rank_tokens = size_t(config_.B) * config_.T;
    if (config_.prefetch_depth == 0) {
        Position pos = consumer_pos_;
        fill(slots_[0], pos);
        consumer_pos_ = pos;
        return {slots_[0].data, slots_[0].data + rank_tokens, seconds()};
    }
    std::unique_lock<std::mutex> lock(mutex_);
    // the batch served last time is no longer the caller's: its slot goes back to the reader
    if (held_ >= 0) {
        free_.push_back(held_);
        held_ = -1;
        free_cv_.notify_one();
    }
    ready_cv_.wait(lock, [&] { return !ready_.empty() || error_; });
    // a read error reaches the caller at the batch it would have filled, after every good batch before it
    if (ready_.empty()) std::rethrow_exception(error_);
    held_ = ready_.front();
    ready_.pop_front();
    consumer_pos_ = slots_[held_].after;
    return {slots_[held_].data, slots_[held_].data + rank_tokens, seconds()};
}

void DataLoader::reader_loop() {
    for (;;) {
        int slot;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            free_cv_.wait(lock, [&] { return stop_ || !free_.empty(); });
            if (stop_) return;
            slot = free_.back();
            free_.pop_back();
        }
        try {
            fill(slots_[slot], reader_pos_);  // outside the lock: reading a window is the slow part
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            error_ = std::current_exception();
            ready_cv_.notify_one();
            return;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        ready_.push_back(slot);
        ready_cv_.notify_one();
    }
}

void DataLoader::start_reader() {
    reader_pos_ = consumer_pos_;
    ready_.clear();
    free_.clear();
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i) free_.push_back(i);
    held_ = -1;
    error_ = nullptr;
    stop_ = false;
    if (config_.prefetch_depth > 0) reader_ = std::thread(&DataLoader::reader_loop, this);
}

void DataLoader::stop_reader() {
    if (!reader_.joinable()) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    free_cv_.notify_all();
    reader_.join();
}

// ---- state ------------------------------------------------------------------------------------------------

DataLoaderState DataLoader::state() const {
    DataLoaderState s{};
    s.magic = kStateMagic;
    s.version = kStateVersion;
    s.seed = config_.seed;
    s.shuffle = config_.shuffle ? 1 : 0;
    s.num_shards = static_cast<uint32_t>(shard_paths_.size());
    s.global_rows = uint64_t(config_.num_ranks) * config_.B;
    s.T = config_.T;
    s.epoch = consumer_pos_.epoch;
    s.shard_pos = consumer_pos_.shard_pos;
    s.window_pos = consumer_pos_.window_pos;
    return s;
}

void DataLoader::restore(const DataLoaderState& s) {
    auto mismatch = [](const std::string& what, uint64_t saved, uint64_t now) {
        fail("cannot restore state: " + what + " is " + std::to_string(saved) + " in the state but " +
             std::to_string(now) + " here");
    };
    if (s.magic != kStateMagic || s.version != kStateVersion)
        fail("cannot restore state: not a DataLoader state (bad magic or version)");
    if (s.seed != config_.seed) mismatch("seed", s.seed, config_.seed);
    if (s.shuffle != (config_.shuffle ? 1u : 0u)) mismatch("shuffle", s.shuffle, config_.shuffle);
    if (s.num_shards != shard_paths_.size()) mismatch("the shard count", s.num_shards, shard_paths_.size());
    if (s.global_rows != uint64_t(config_.num_ranks) * config_.B)
        mismatch("num_ranks*B", s.global_rows, uint64_t(config_.num_ranks) * config_.B);
    if (s.T != uint64_t(config_.T)) mismatch("T", s.T, config_.T);
    // the order caches below belong to the reader while it runs; batches it read ahead are dropped, and it restarts
    // from the restored position
    stop_reader();
    if (s.shard_pos >= shard_paths_.size() ||
        s.window_pos >= windows_per_shard_[shard_order(s.epoch, reader_order_)[s.shard_pos]]) {
        start_reader();
        fail("cannot restore state: position (epoch " + std::to_string(s.epoch) + ", shard " +
             std::to_string(s.shard_pos) + ", window " + std::to_string(s.window_pos) + ") does not exist");
    }
    consumer_pos_ = Position{s.epoch, s.shard_pos, s.window_pos};
    start_reader();
}

// Back to the first batch (validation runs the same batches at every evaluation).
void DataLoader::reset() {
    stop_reader();
    consumer_pos_ = first_position();
    start_reader();
}
