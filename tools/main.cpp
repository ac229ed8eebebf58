// firsttoken: command-line entry point. Subcommands: run, make-model, inspect, bench, serve, client, profile.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"firsttoken: LLM inference engine with the fastest first token"};
  app.require_subcommand(1);
  ft::tools::RunArgs run;
  ft::tools::MakeModelArgs make;
  ft::tools::InspectArgs inspect;
  ft::tools::BenchArgs bench;
  ft::tools::add_run(app, run);
  ft::tools::add_make_model(app, make);
  ft::tools::add_inspect(app, inspect);
  ft::tools::add_bench(app, bench);
  ft::tools::ServeArgs serve;
  ft::tools::add_serve(app, serve);
  ft::tools::ClientArgs client;
  ft::tools::add_client(app, client);
  ft::tools::ProfileArgs profile;
  ft::tools::add_profile(app, profile);
  ft::tools::PerplexityArgs perplexity;
  ft::tools::add_perplexity(app, perplexity);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("run")) return ft::tools::cmd_run(run);
    if (app.got_subcommand("make-model")) return ft::tools::cmd_make_model(make);
    if (app.got_subcommand("inspect")) return ft::tools::cmd_inspect(inspect);
    if (app.got_subcommand("bench")) return ft::tools::cmd_bench(bench);
    if (app.got_subcommand("serve")) return ft::tools::cmd_serve(serve);
    if (app.got_subcommand("client")) return ft::tools::cmd_client(client);
    if (app.got_subcommand("profile")) return ft::tools::cmd_profile(profile);
    if (app.got_subcommand("perplexity")) return ft::tools::cmd_perplexity(perplexity);
  } catch (const ft::Error& e) {
    ft::say_error(e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "firsttoken: internal error: %s\n", e.what());
    return 2;
  }
  return 1;
}
