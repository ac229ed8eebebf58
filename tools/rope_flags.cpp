// --rope-scaling, --rope-scale, --rope-freq-base, --yarn-orig-ctx: RoPE over the file's keys on run,
// serve, perplexity and bench model.
#include "tools/commands.h"

namespace ft::tools {

void add_rope_flags(CLI::App* c, RopeOverrides& r) {
  c->add_option("--rope-scaling", r.scaling, "RoPE scaling over the file's: none, linear or yarn (e.g. Qwen2.5/Qwen3 "
                                             "past 32K: --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768)");
  c->add_option("--rope-scale", r.scale, "RoPE context scaling factor: the context grows N times (default: the file's)");
  c->add_option("--rope-freq-base", r.freq_base, "RoPE base frequency (default: the file's)");
  c->add_option("--yarn-orig-ctx", r.orig_ctx, "YaRN: the model's original training context (default: the file's)");
}

}  // namespace ft::tools
