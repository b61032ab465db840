// tokenspeed: one binary, sub-commands registered by src/cli/cmd_*.cpp.
#include <cstdio>
#include <cstring>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

namespace ts::cli {
std::map<std::string, Command>& registry() {
  static std::map<std::string, Command> r;
  return r;
}
}  // namespace ts::cli

static void usage() {
  std::fprintf(stderr, "usage: tokenspeed <command> [options]   (tokenspeed <command> --help)\n\ncommands:\n");
  for (auto& [name, c] : ts::cli::registry()) std::fprintf(stderr, "  %-16s %s\n", name.c_str(), c.help.c_str());
}

int main(int argc, char** argv) {
  ts::init_logging();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  auto& reg = ts::cli::registry();
  std::string name = argv[1];
  // Two-word commands: `bench agentic` is registered as "bench-agentic".
  if (argc >= 3 && argv[2][0] != '-' && reg.count(name + "-" + argv[2])) {
    name += std::string("-") + argv[2];
    ++argv;
    --argc;
  }
  auto it = reg.find(name);
  if (it == reg.end()) {
    std::fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
  }
  try {
    return it->second.fn(argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
