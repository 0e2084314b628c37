// SPDX-License-Identifier: Apache-2.0
// What every stoker program does the same way at its edges. Private to apps/.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unistd.h>

#include "checks.h"
#include "format.h"
#include "version_text.h"

namespace stoker::apps {

/// A bad argument found after parsing: guarded_main reports it on one line with exit status 2,
/// as parse_command_line does a bad option.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Makes `path`, given to `option`, ready to be written before any work is done: creates its
/// missing parent directories; throws UsageError naming the option when `path` is a directory
/// or cannot be written. Creates no file.
inline void prepare_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const std::string what = option + " " + path + ": ";
  std::error_code error;
  if (fs::is_directory(file, error)) throw UsageError(what + "is a directory");
  const fs::path parent = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  fs::create_directories(parent, error);
  if (error) throw UsageError(what + "cannot create its directory: " + error.message());
  const bool exists = fs::exists(file, error);
  if (::access((exists ? file : parent).c_str(), W_OK) != 0)
    throw UsageError(what + "cannot be written: " + std::strerror(errno));
}

/// Makes `dir`, given to `option`, ready for files to be written into before any work is done:
/// creates it and its missing parents; throws UsageError naming the option when it is not a
/// directory or cannot be written.
inline void prepare_output_directory(const std::string& option, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string what = option + " " + dir + ": ";
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_directory(dir, error)) throw UsageError(what + "is not a directory");
  fs::create_directories(dir, error);
  if (error) throw UsageError(what + "cannot be created: " + error.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw UsageError(what + "cannot be written: " + std::strerror(errno));
}

/// Parses the command line, with --version added. Returns the exit status when the program is
/// done already: 0 after --help or --version, 2 after a bad argument, reported on one line of
/// stderr.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  app.set_version_flag("--version", version_text(app.get_name()),
                       "Print the version, the commit and what this build has (CUDA, MPI, image decoders), and exit");
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << one_line(e.what()) << " (see " << app.get_name() << " --help)\n";
    return 2;
  }
}

/// Runs a program's `run(argc, argv)`. An exception that escapes it becomes one line on
/// stderr, after whatever stdout already holds, and exit status 1 (2 for a UsageError).
template <class Run>
int guarded_main(const char* program, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cout.flush();
    std::cerr << program << ": " << one_line(e.what()) << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << program << ": error: " << one_line(e.what()) << '\n';
    return 1;
  }
}

}  // namespace stoker::apps
