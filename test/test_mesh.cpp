// Tests for the process mesh's rank arithmetic (distributed/mesh.h): coordinates and ranks round-trip, tp is
// the innermost axis (then pp, then dp), every group lies along its own axis in order of it and partitions
// the world, the embedding groups join the first and the last pipeline stage, and mesh_shape_problem accepts
// exactly the shapes that divide the world. Explicit tables pin the layout down (a mesh with another axis
// order would still pass the structural checks, not these).
//
// Needs no GPU, CUDA or NCCL. Prints one PASS/FAIL line per check (test/check.h); exits 1 on any FAIL.
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../distributed/mesh.h"
#include "check.h"

namespace {

std::string shape_name(const MeshShape& s) {
    return "tp " + std::to_string(s.tp) + " x pp " + std::to_string(s.pp) + " x dp " + std::to_string(s.dp);
}
std::string coord_name(const MeshCoord& c) {
    return "(tp " + std::to_string(c.tp) + ", pp " + std::to_string(c.pp) + ", dp " + std::to_string(c.dp) + ")";
}
std::string list_name(const std::vector<int>& v) {
    std::string s = "{";
    for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "}";
}
const char* group_name(MeshGroup g) {
    switch (g) {
        case MeshGroup::kTensor: return "tensor";
        case MeshGroup::kPipeline: return "pipeline";
        case MeshGroup::kData: return "data";
        case MeshGroup::kEmbedding: return "embedding";
    }
    return "?";
}

// Every tp, pp, dp in 1..4, and a few larger meshes.
std::vector<MeshShape> test_shapes() {
    std::vector<MeshShape> shapes;
    for (int tp = 1; tp <= 4; tp++)
        for (int pp = 1; pp <= 4; pp++)
            for (int dp = 1; dp <= 4; dp++) shapes.push_back({tp, pp, dp});
    for (MeshShape s : {MeshShape{8, 1, 1}, MeshShape{1, 8, 1}, MeshShape{1, 1, 8}, MeshShape{2, 4, 2}, MeshShape{8, 2, 4},
                        MeshShape{4, 8, 2}, MeshShape{2, 2, 16}})
        shapes.push_back(s);
    return shapes;
}

// Records the first failure of a check that runs over many shapes; prints one line at the end.
struct Verdict {
    explicit Verdict(std::string check_name) : name(std::move(check_name)) {}
    std::string name, first_failure;
    int cases = 0;
    void expect(bool ok, const std::string& why) {
        cases++;
        if (!ok && first_failure.empty()) first_failure = why;
    }
    ~Verdict() { check(first_failure.empty(), name, first_failure.empty() ? std::to_string(cases) + " cases" : first_failure); }
};

int axis_of(const MeshCoord& c, MeshGroup g) { return g == MeshGroup::kTensor ? c.tp : g == MeshGroup::kPipeline ? c.pp : c.dp; }
// The coordinates with the group's own axis zeroed (the embedding group runs along pp).
MeshCoord without_axis(MeshCoord c, MeshGroup g) {
    if (g == MeshGroup::kTensor) c.tp = 0;
    else if (g == MeshGroup::kData) c.dp = 0;
    else c.pp = 0;
    return c;
}
bool same(const MeshCoord& a, const MeshCoord& b) { return a.tp == b.tp && a.pp == b.pp && a.dp == b.dp; }

void test_coordinates() {
    Verdict round_trip{"rank -> coordinates -> rank, coordinates in range"};
    Verdict innermost{"tp innermost, then pp, then dp"};
    for (const MeshShape& s : test_shapes()) {
        std::set<std::string> seen;
        for (int r = 0; r < s.world(); r++) {
            const MeshCoord c = mesh_coord(s, r);
            const std::string where = shape_name(s) + ", rank " + std::to_string(r) + " " + coord_name(c);
            round_trip.expect(c.tp >= 0 && c.tp < s.tp && c.pp >= 0 && c.pp < s.pp && c.dp >= 0 && c.dp < s.dp,
                              where + ": out of range");
            round_trip.expect(mesh_rank(s, c) == r, where + ": mesh_rank gives " + std::to_string(mesh_rank(s, c)));
            round_trip.expect(seen.insert(coord_name(c)).second, where + ": two ranks have these coordinates");
            innermost.expect(c.tp == r % s.tp && c.pp == r / s.tp % s.pp && c.dp == r / (s.tp * s.pp), where);
            if (r + 1 < s.world() && (r + 1) % s.tp != 0) {
                const MeshCoord n = mesh_coord(s, r + 1);
                innermost.expect(n.pp == c.pp && n.dp == c.dp && n.tp == c.tp + 1,
                                 where + ": rank " + std::to_string(r + 1) + " is " + coord_name(n));
            }
        }
    }
}

void test_groups() {
    const MeshGroup kinds[] = {MeshGroup::kTensor, MeshGroup::kPipeline, MeshGroup::kData};
    Verdict along{"groups lie along their own axis, in its order"};
    Verdict agree{"groups: every member sees the same list"};
    Verdict partition{"groups: every rank in exactly one group of each kind"};
    Verdict sizes{"group sizes are tp, pp, dp"};
    for (const MeshShape& s : test_shapes()) {
        for (MeshGroup g : kinds) {
            const int expected_size = g == MeshGroup::kTensor ? s.tp : g == MeshGroup::kPipeline ? s.pp : s.dp;
            std::vector<int> times_seen(s.world(), 0);
            std::set<std::vector<int>> groups;
            for (int r = 0; r < s.world(); r++) {
                const std::vector<int> ranks = mesh_group_ranks(s, r, g);
                const std::string where = shape_name(s) + ", rank " + std::to_string(r) + ", " + group_name(g) + " group " + list_name(ranks);
                sizes.expect((int)ranks.size() == expected_size, where + ": size " + std::to_string(ranks.size()));
                int members_of_r = 0;
                for (size_t i = 0; i < ranks.size(); i++) {
                    if (ranks[i] < 0 || ranks[i] >= s.world()) {
                        along.expect(false, where + ": rank out of range");
                        continue;
                    }
                    const MeshCoord m = mesh_coord(s, ranks[i]);
                    along.expect(same(without_axis(m, g), without_axis(mesh_coord(s, r), g)), where + ": member " + std::to_string(ranks[i]) + " is " + coord_name(m));
                    along.expect(axis_of(m, g) == (int)i, where + ": member " + std::to_string(i) + " is " + coord_name(m));
                    agree.expect(mesh_group_ranks(s, ranks[i], g) == ranks,
                                 where + ": member " + std::to_string(ranks[i]) + " sees " + list_name(mesh_group_ranks(s, ranks[i], g)));
                    members_of_r += ranks[i] == r;
                }
                partition.expect(members_of_r == 1, where + ": rank is not exactly once in its own group");
                if (groups.insert(ranks).second)
                    for (int m : ranks)
                        if (m >= 0 && m < s.world()) times_seen[m]++;
            }
            for (int r = 0; r < s.world(); r++)
                partition.expect(times_seen[r] == 1, shape_name(s) + ": rank " + std::to_string(r) + " is in " +
                                                          std::to_string(times_seen[r]) + " " + group_name(g) + " groups");
        }
    }
}

void test_embedding_groups() {
    Verdict v{"embedding groups: first and last stage of each (tp, dp), none for middle stages"};
    for (const MeshShape& s : test_shapes()) {
        std::vector<int> times_seen(s.world(), 0);
        std::set<std::vector<int>> groups;
        for (int r = 0; r < s.world(); r++) {
            const MeshCoord c = mesh_coord(s, r);
            const std::vector<int> ranks = mesh_group_ranks(s, r, MeshGroup::kEmbedding);
            const std::string where = shape_name(s) + ", rank " + std::to_string(r) + " " + coord_name(c) + ": embedding group " + list_name(ranks);
            MeshCoord first = c, last = c;
            first.pp = 0;
            last.pp = s.pp - 1;
            const bool end_stage = c.pp == 0 || c.pp == s.pp - 1;
            const std::vector<int> expected = s.pp == 1 ? std::vector<int>{r}
                                              : end_stage ? std::vector<int>{mesh_rank(s, first), mesh_rank(s, last)}
                                                          : std::vector<int>{};
            v.expect(ranks == expected, where + ", expected " + list_name(expected));
            for (int m : ranks)
                if (m >= 0 && m < s.world())
                    v.expect(mesh_group_ranks(s, m, MeshGroup::kEmbedding) == ranks, where + ": member " + std::to_string(m) + " disagrees");
            if (groups.insert(ranks).second)
                for (int m : ranks)
                    if (m >= 0 && m < s.world()) times_seen[m]++;
        }
        for (int r = 0; r < s.world(); r++) {
            const int stage = mesh_coord(s, r).pp;
            const int expected = stage == 0 || stage == s.pp - 1 ? 1 : 0;
            v.expect(times_seen[r] == expected, shape_name(s) + ": rank " + std::to_string(r) + " is in " + std::to_string(times_seen[r]) + " embedding groups");
        }
    }
}

// Explicit layouts: these fail for any axis order other than tp innermost, then pp, then dp.
void test_explicit_layouts() {
    {
        const MeshShape s{2, 2, 2};  // world 8
        const int expected[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}, {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
        std::string bad;
        for (int r = 0; r < 8; r++) {
            const MeshCoord c = mesh_coord(s, r);
            if (c.tp != expected[r][0] || c.pp != expected[r][1] || c.dp != expected[r][2]) bad += " rank " + std::to_string(r) + " " + coord_name(c);
        }
        expect(bad.empty(), "tp 2 x pp 2 x dp 2 coordinates (rank 5 = tp 1, pp 0, dp 1)", "wrong:" + bad);
        const MeshCoord c5 = mesh_coord(s, 5);
        expect(c5.tp == 1 && c5.pp == 0 && c5.dp == 1 && mesh_rank(s, {1, 0, 1}) == 5, "tp 2 x pp 2 x dp 2 rank 5", coord_name(c5));
        struct Case { int rank; MeshGroup group; std::vector<int> ranks; };
        const Case cases[] = {
            {0, MeshGroup::kTensor, {0, 1}},     {5, MeshGroup::kTensor, {4, 5}},     {6, MeshGroup::kTensor, {6, 7}},
            {0, MeshGroup::kPipeline, {0, 2}},   {5, MeshGroup::kPipeline, {5, 7}},   {3, MeshGroup::kPipeline, {1, 3}},
            {0, MeshGroup::kData, {0, 4}},       {5, MeshGroup::kData, {1, 5}},       {6, MeshGroup::kData, {2, 6}},
            {5, MeshGroup::kEmbedding, {5, 7}},  {2, MeshGroup::kEmbedding, {0, 2}},
        };
        bad.clear();
        for (const Case& k : cases) {
            const std::vector<int> got = mesh_group_ranks(s, k.rank, k.group);
            if (got != k.ranks)
                bad += std::string(" rank ") + std::to_string(k.rank) + " " + group_name(k.group) + " " + list_name(got) + " (expected " + list_name(k.ranks) + ")";
        }
        expect(bad.empty(), "tp 2 x pp 2 x dp 2 groups", "wrong:" + bad);
    }
    {
        const MeshShape s{2, 3, 2};  // world 12: stages 0, 1, 2
        struct Case { int rank; MeshGroup group; std::vector<int> ranks; };
        const Case cases[] = {
            {0, MeshGroup::kTensor, {0, 1}},      {9, MeshGroup::kTensor, {8, 9}},
            {1, MeshGroup::kPipeline, {1, 3, 5}}, {8, MeshGroup::kPipeline, {6, 8, 10}},
            {3, MeshGroup::kData, {3, 9}},        {10, MeshGroup::kData, {4, 10}},
            {1, MeshGroup::kEmbedding, {1, 5}},   {5, MeshGroup::kEmbedding, {1, 5}},  {10, MeshGroup::kEmbedding, {6, 10}},
            {3, MeshGroup::kEmbedding, {}},       {8, MeshGroup::kEmbedding, {}},
        };
        std::string bad;
        for (const Case& k : cases) {
            const std::vector<int> got = mesh_group_ranks(s, k.rank, k.group);
            if (got != k.ranks)
                bad += std::string(" rank ") + std::to_string(k.rank) + " " + group_name(k.group) + " " + list_name(got) + " (expected " + list_name(k.ranks) + ")";
        }
        expect(bad.empty(), "tp 2 x pp 3 x dp 2 groups (middle stage: no embedding group)", "wrong:" + bad);
        const MeshCoord c7 = mesh_coord(s, 7);
        expect(c7.tp == 1 && c7.pp == 0 && c7.dp == 1, "tp 2 x pp 3 x dp 2 rank 7 = tp 1, pp 0, dp 1", coord_name(c7));
    }
}

void test_shape_problem() {
    Verdict accepts{"mesh_shape_problem is empty exactly when tp, pp >= 1 and tp * pp divides the world"};
    Verdict names{"mesh_shape_problem messages are one line naming the flag(s) and values"};
    for (int world = 1; world <= 16; world++) {
        for (int tp = -1; tp <= 17; tp++) {
            for (int pp = -1; pp <= 17; pp++) {
                const std::string p = mesh_shape_problem(world, tp, pp);
                const bool valid = tp >= 1 && pp >= 1 && world % (tp * pp) == 0;
                const std::string where = "world " + std::to_string(world) + ", tp " + std::to_string(tp) + ", pp " + std::to_string(pp);
                accepts.expect(p.empty() == valid, where + ": \"" + p + "\"");
                if (p.empty()) continue;
                names.expect(p.find('\n') == std::string::npos, where + ": several lines: " + p);
                if (tp < 1) names.expect(p.find("--tensor-parallel " + std::to_string(tp)) != std::string::npos, where + ": " + p);
                else if (pp < 1) names.expect(p.find("--pipeline-parallel " + std::to_string(pp)) != std::string::npos, where + ": " + p);
                else
                    names.expect(p.find("--tensor-parallel " + std::to_string(tp)) != std::string::npos &&
                                     p.find("--pipeline-parallel " + std::to_string(pp)) != std::string::npos &&
                                     p.find(std::to_string(world) + " rank") != std::string::npos,
                                 where + ": " + p);
            }
        }
    }
    const std::string p = mesh_shape_problem(4, 3, 1);
    expect(p == "--tensor-parallel 3 x --pipeline-parallel 1 = 3 does not divide the 4 ranks", "mesh_shape_problem(4, 3, 1) message", p);
    const std::string big = mesh_shape_problem(8, 1 << 20, 1 << 20);  // tp * pp overflows an int
    expect(!big.empty(), "mesh_shape_problem with tp * pp past INT_MAX", "accepted");
}

void test_communicator_defaults() {
    const ProcessMesh mesh;  // before build(): one rank, no communicators
    bool ok = mesh.shape.world() == 1;
    for (const Communicator* c : {&mesh.tensor, &mesh.pipeline, &mesh.data, &mesh.embedding}) ok = ok && c->comm == nullptr && c->rank == 0 && c->size == 1;
    expect(ok, "defaults: a 1 x 1 x 1 mesh of groups of one rank without communicators", "not so");
}

}  // namespace

int main() {
    check_suite("mesh");
    test_coordinates();
    test_groups();
    test_embedding_groups();
    test_explicit_layouts();
    test_shape_problem();
    test_communicator_defaults();
    return check_failures() ? 1 : 0;
}
