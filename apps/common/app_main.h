// What every stoker program does the same way at its edges. Private to apps/.
#pragma once

#include <algorithm>
#include <exception>
#include <iostream>
#include <string>

namespace stoker::apps {

/// CLI11 puts its hint on a second line; the contract is one line on stderr.
inline std::string one_line(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  return message;
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
