// SPDX-License-Identifier: Apache-2.0
// What every stoker program does the same way at its edges. Private to apps/.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
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
#include <utility>
#include <vector>

#include "checks.h"
#include "format.h"
#include "version_text.h"

namespace stoker::apps {

/// Where the page `page` of stoker's docs is, for a --help text: beside an installed program, in
/// the install's share/doc/stoker/docs; from a build tree, docs/ of stoker's source.
inline std::string doc_page(const std::string& page) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path installed = (exe.parent_path() / STOKER_BIN_TO_DOC / "docs" / page).lexically_normal();
    if (fs::is_regular_file(installed, error)) return installed.string();
  }
  return "docs/" + page;
}

/// A bad argument found after parsing: guarded_main reports it on one line with exit status 2,
/// as parse_command_line does a bad option.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Makes `path`, given to `option`, ready to be written before any work is done: creates its
/// missing parent directories, saying so on stderr; throws UsageError naming the option when
/// `path` is a directory or cannot be written. Creates no file.
inline void prepare_output_file(const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const std::string what = option + " " + path + ": ";
  std::error_code error;
  if (fs::is_directory(file, error)) throw UsageError(what + "is a directory");
  const fs::path parent = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  if (fs::create_directories(parent, error))
    std::cerr << "note: " << what << "created the folder " << parent.string() << "\n";
  if (error) throw UsageError(what + "cannot create its directory: " + error.message());
  const bool exists = fs::exists(file, error);
  if (::access((exists ? file : parent).c_str(), W_OK) != 0)
    throw UsageError(what + "cannot be written: " + std::strerror(errno));
}

/// Makes `dir`, given to `option`, ready for files to be written into before any work is done:
/// creates it and its missing parents, saying so on stderr; throws UsageError naming the option when it is not a
/// directory or cannot be written.
inline void prepare_output_directory(const std::string& option, const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string what = option + " " + dir + ": ";
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_directory(dir, error)) throw UsageError(what + "is not a directory");
  if (fs::create_directories(dir, error)) std::cerr << "note: " << what << "created the folder\n";
  if (error) throw UsageError(what + "cannot be created: " + error.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw UsageError(what + "cannot be written: " + std::strerror(errno));
}

/// The long option of `app` or of the subcommands it parsed that `arg` (an unexpected "--name")
/// most likely meant: one at most two edits away, or one it is the start of; empty if none is.
inline std::string nearest_option(const CLI::App& app, const std::string& arg) {
  if (arg.size() < 3 || arg.rfind("--", 0) != 0) return {};
  const std::string typed = arg.substr(2, arg.find('=') - 2);
  const auto distance = [](const std::string& a, const std::string& b) {  // Levenshtein
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j)
        diagonal = std::exchange(row[j], std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])}));
    }
    return row[b.size()];
  };
  std::string best;
  std::size_t best_distance = 3;
  std::vector<const CLI::App*> apps{&app};
  for (const CLI::App* sub : app.get_subcommands()) apps.push_back(sub);
  for (const CLI::App* a : apps)
    for (const CLI::Option* option : a->get_options())
      for (const std::string& name : option->get_lnames()) {
        const std::size_t d = name.rfind(typed, 0) == 0 ? 1 : distance(typed, name);
        if (d < best_distance) best_distance = d, best = "--" + name;
      }
  return best;
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
    std::string hint;
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr)
      for (const std::string& arg : app.remaining(true))
        if (const std::string near = nearest_option(app, arg); !near.empty()) {
          hint = "; " + arg + ": did you mean " + near + "?";
          break;
        }
    std::cerr << app.get_name() << ": " << one_line(e.what()) << hint << " (see " << app.get_name() << " --help)\n";
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
