// `firsttoken profile FILE`: the summary of a trace written by `run --profile` / `serve --profile`.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"
#include "profile/summary.h"
#include "tools/commands.h"

namespace ft::tools {

void add_profile(CLI::App& app, ProfileArgs& a) {
  CLI::App* c = app.add_subcommand("profile", "Summarize a trace from run/serve --profile (time per op, idle gaps, memory)");
  c->add_option("file", a.file, "Trace JSON file")->required();
  c->add_option("--top", a.top, "Ops named on the 'top ops' line")->capture_default_str();
}

int cmd_profile(const ProfileArgs& a) {
  std::ifstream in(a.file, std::ios::binary);
  if (!in) fail(a.file, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  // Before parsing: a summary copies subtrees, which recurses per level (200,000 levels overflowed
  // the stack); our traces nest a few levels.
  if (!json_depth_within(text.view())) fail(a.file, ": nests more than ", kMaxJsonDepth, " levels");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.view());
  } catch (const nlohmann::json::exception& e) {
    fail(a.file, ": not valid JSON: ", e.what());
  }
  profile::Summary s;
  try {
    s = profile::summarize(j);
  } catch (const Error& e) {
    fail(a.file, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    fail(a.file, ": not a firsttoken trace: ", e.what());
  }
  std::printf("profile %s\n%s", a.file.c_str(), profile::format_summary(s, a.top).c_str());
  return 0;
}

}  // namespace ft::tools
