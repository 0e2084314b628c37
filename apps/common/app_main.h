// What every stoker program does the same way at its edges. Private to apps/.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <optional>
#include <string>

#include "checks.h"
#include "format.h"

namespace stoker::apps {

/// Parses the command line. Returns the exit status when the program is done already: 0 after
/// --help, 2 after a bad argument, reported on one line of stderr.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << one_line(e.what()) << " (see " << app.get_name() << " --help)\n";
    return 2;
  }
}

/// Runs a program's `run(argc, argv)`. An exception that escapes it becomes one line on
/// stderr, after whatever stdout already holds, and exit status 1.
template <class Run>
int guarded_main(const char* program, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << program << ": error: " << one_line(e.what()) << '\n';
    return 1;
  }
}

}  // namespace stoker::apps
