// CLI sub-commands register themselves here (each src/cli/cmd_*.cpp holds one). The CLI sources
// are linked into the executable as objects, so the static registrars always run.
#pragma once
#include <functional>
#include <map>
#include <string>

namespace ts::cli {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is the sub-command name

struct Command {
  std::string help;
  CommandFn fn;
};

std::map<std::string, Command>& registry();

struct Register {
  Register(const char* name, const char* help, CommandFn fn) { registry()[name] = {help, fn}; }
};

}  // namespace ts::cli

#define TS_COMMAND(name, help, fn) static ::ts::cli::Register ts_register_##fn(name, help, fn)
