// DataLoader: serves batches of B rows x (T+1) tokens from a sorted glob of llm.c token shards (uint16 or uint32
// tokens, mixed if need be), in the batch order of docs/formats.md, for one of `num_ranks` data-parallel ranks.
//
// Order. The global window of a step is num_ranks*B rows: tokens [o, o + num_ranks*B*T] of one shard; rank r
// takes rows r*B .. r*B+B-1, i.e. tokens [o + r*B*T, o + (r+1)*B*T] (inputs are each row's first T tokens,
// targets its last T). A shard with N tokens holds the windows o = k*G (G = num_ranks*B*T) with o + G + 1 <= N.
// Unshuffled: shards in sorted order, windows in order, then wrap (a new epoch). Shuffled: each epoch takes
// the shards in a permuted order, and each shard's windows in a permuted order; both permutations are pure
// functions of (seed, epoch[, shard]), so every rank computes the same ones and the ranks still split one
// global window between them.
//
// Resuming. state() is a small POD; restore() makes the loader continue exactly where the saved one was
// (the permutations are recomputed from the seed, so the "RNG state" is just seed + position). A state can
// be restored with a different rank count as long as the global window (num_ranks*B) and T are the same.
//
// Masks (chat data, docs/formats.md). When a mask shard sits beside a shard (mask_shard_path: X.bin.mask), every
// shard must have one; a target whose mask byte is 0 is served as -1, which every consumer of targets ignores (the
// loss gives it 0 and a zero gradient). A mask shard was laid out for windows of its T (each conversation starts at
// a multiple of T), so T must be that; a fit_to_data loader keeps T and serves fewer rows, never a shorter one.
// counted_targets_ahead() counts the targets that count in the next batches over all ranks (every rank reads the
// global window's mask: the same number on every rank, without communication), which the loss is averaged over.
//
// Data shorter than one batch. A loader with fit_to_data (validation) whose shards hold fewer tokens than one batch
// serves the largest batch they hold instead of failing: B' < B rows of T per rank, or, when not even one row of T
// per rank fits, one row of T' < T; B() and T() say which.
//
// Prefetch. With prefetch_depth > 0 a background thread reads up to that many batches ahead into buffers
// from a caller-supplied allocator (the trainer passes cudaMallocHost/cudaFreeHost for pinned memory; this
// file does not depend on CUDA). With 0, next() reads synchronously. Errors in the reader thread (I/O, bad
// token ids) are rethrown by the next() that would have returned the failed batch.
//
// Threading: call the public methods from one thread; the reader thread is internal and stopped by
// restore()/reset() and the destructor.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

class ShardReader;
class MaskReader;

struct HostAllocator {
    std::function<void*(size_t bytes)> allocate;  // must return memory aligned for int32_t, or throw
    std::function<void(void*)> deallocate;
    static HostAllocator system();  // std::malloc / std::free
};

struct DataLoaderConfig {
    std::string pattern;  // glob of shard files, e.g. "data/tinyshakespeare/tinyshakespeare_train_*.bin" (mask shards
                          // it matches are not shards: they are found beside their shards)
    int B = 0;            // rows per rank
    int T = 0;            // sequence length
    int num_ranks = 1;
    int rank = 0;
    bool shuffle = false;
    uint64_t seed = 0;
    int prefetch_depth = 2;   // batches read ahead by the background thread; 0 = synchronous
    int vocab_size = 50257;   // every served token id must be below this
    bool fit_to_data = false;  // fewer tokens than one batch: serve fewer rows, or one shorter row, instead of failing
    HostAllocator allocator = HostAllocator::system();
};

// Pointers stay valid until the next call to next(), reset() or restore(), or the loader's destruction.
struct Batch {
    const int32_t* inputs;   // B*T, row-major
    const int32_t* targets;  // B*T; -1 where the target does not count (a mask byte 0)
    double wait_seconds;     // how long next() blocked on data (the whole read when synchronous)
};

// Position of the next batch, plus what the position means. Fixed layout: store it as raw bytes.
struct DataLoaderState {
    uint32_t magic;
    uint32_t version;
    uint64_t seed;
    uint32_t shuffle;
    uint32_t num_shards;
    uint64_t global_rows;  // num_ranks * B
    uint64_t T;
    uint64_t epoch;
    uint64_t shard_pos;   // index into this epoch's shard order
    uint64_t window_pos;  // index into that shard's window order
};
static_assert(sizeof(DataLoaderState) == 64 && std::is_trivially_copyable<DataLoaderState>::value,
              "DataLoaderState is stored as raw bytes in checkpoints");

class DataLoader {
public:
    explicit DataLoader(const DataLoaderConfig& config);
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    Batch next();
    DataLoaderState state() const;
    void restore(const DataLoaderState& state);  // throws if the state belongs to a different setup
    void reset();                                // back to the first batch of epoch 0

    uint64_t num_tokens() const { return num_tokens_; }  // all tokens in all shards
    size_t num_shards() const { return shard_paths_.size(); }
    const std::vector<std::string>& shard_paths() const { return shard_paths_; }
    uint64_t batches_per_epoch() const { return batches_per_epoch_; }
    int B() const { return config_.B; }  // rows per rank of a batch: the config's, or fewer (fit_to_data)
    int T() const { return config_.T; }  // tokens per row: the config's, or fewer (fit_to_data)
    bool has_masks() const { return has_masks_; }
    // The targets that count in the next `batches` batches next() will serve, summed over all ranks (without masks:
    // every target, batches * num_ranks * B * T). Reads the masks of those global windows (memoised per window).
    uint64_t counted_targets_ahead(uint64_t batches);

private:
    struct Position {
        uint64_t epoch = 0, shard_pos = 0, window_pos = 0;
    };
    struct Slot {
        int32_t* data = nullptr;  // inputs (B*T) then targets (B*T)
        Position after;           // position following this batch
    };

    // The permutations of one epoch, cached: the reader thread and counted_targets_ahead() (the caller's thread) walk
    // the order each with their own.
    struct OrderCache {
        uint64_t shard_epoch = UINT64_MAX;
        std::vector<uint32_t> shards;
        uint64_t window_epoch = UINT64_MAX;
        uint32_t window_shard = 0;
        std::vector<uint32_t> windows;
    };
    // An open mask shard, reopened once per shard as the shards are.
    struct OpenMask {
        std::unique_ptr<MaskReader> reader;
        uint32_t shard = 0;
    };

    void open_masks();     // has_masks_, and every mask shard checked against its shard and T
    void count_windows();  // windows_per_shard_, batches_per_epoch_ and global_tokens_ for the current B and T
    Position first_position();
    void fill(Slot& slot, Position& pos);  // reads the batch at pos into slot and advances pos
    void advance(Position& pos, OrderCache& cache);
    uint64_t window_of(const Position& pos, OrderCache& cache);  // the window index in its shard
    const std::vector<uint32_t>& shard_order(uint64_t epoch, OrderCache& cache);
    const std::vector<uint32_t>& window_order(uint64_t epoch, uint32_t shard, OrderCache& cache);
    const MaskReader& mask_of(uint32_t shard, OpenMask& open);
    void start_reader();
    void stop_reader();
    void reader_loop();

    DataLoaderConfig config_;
    std::vector<std::string> shard_paths_;
    std::vector<uint64_t> shard_tokens_;
    std::vector<uint64_t> windows_per_shard_;
    uint64_t num_tokens_ = 0;
    uint64_t batches_per_epoch_ = 0;
    uint64_t global_tokens_ = 0;  // G = num_ranks*B*T
    bool has_masks_ = false;

    // Used only by counted_targets_ahead() (the caller's thread).
    OrderCache lookahead_order_;
    OpenMask lookahead_mask_;
    std::vector<std::vector<uint64_t>> window_counts_;  // per shard and window: its counted targets, or UINT64_MAX
    std::vector<uint8_t> lookahead_bytes_;

    // Used only by whoever fills slots (the reader thread, or next() when synchronous).
    std::unique_ptr<ShardReader> open_shard_;
    uint32_t open_shard_index_ = 0;
    std::vector<uint32_t> scratch_;
    std::vector<uint8_t> mask_scratch_;
    OpenMask open_mask_;
    OrderCache reader_order_;  // also the caller's while the reader is stopped (restore, reset)

    std::vector<Slot> slots_;
    Position consumer_pos_;  // position of the batch next() returns next
    Position reader_pos_;    // position of the batch the reader fills next

    std::mutex mutex_;
    std::condition_variable ready_cv_, free_cv_;
    std::deque<int> ready_;  // filled slots, oldest first
    std::vector<int> free_;
    int held_ = -1;          // the slot whose batch the caller is using
    bool stop_ = false;
    std::exception_ptr error_;
    std::thread reader_;
};
