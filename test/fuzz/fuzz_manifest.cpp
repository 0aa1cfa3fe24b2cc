// Fuzzes checkpoint manifests (model/checkpoint_store.h: parse_manifest), the commit marker --resume reads: the input
// is the file's text. A manifest that parses names a step, a run and at least one file, each a plain name in the
// folder, and writes back to a text that parses to the same manifest.
#include "fuzz_util.h"
#include "model/checkpoint_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    CheckpointManifest m;
    std::string problem;
    if (refused([&] { problem = parse_manifest(text, &m); }) || !problem.empty()) return 0;
    FUZZ_CHECK(m.step >= 0 && !m.files.empty(), "a manifest names its step and at least one file");
    for (const FileRecord& f : m.files) FUZZ_CHECK(f.name.find('/') == std::string::npos, "a manifest's files are in its folder");
    CheckpointManifest again;
    FUZZ_CHECK(parse_manifest(manifest_text(m), &again).empty() && again.run_id == m.run_id && again.step == m.step && again.files == m.files &&
                   again.settings.size() == m.settings.size(),
               "a manifest written back parses to the same one");
    return 0;
}
