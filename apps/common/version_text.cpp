// SPDX-License-Identifier: Apache-2.0
#include "version_text.h"

#include "stoker/config.h"
#include "stoker/version.h"
#include "stoker_commit.h"  // generated at every build (cmake/commit.cmake)

namespace stoker::apps {

std::string version_text(const std::string& program) {
  std::string text = program + " " + STOKER_VERSION_STRING;
  if (*STOKER_COMMIT != '\0') text += std::string(" (commit ") + STOKER_COMMIT + ")";
  return text + "\nbuilt with: " + STOKER_BUILD_FEATURES + "\nlicense: Apache-2.0";
}

}  // namespace stoker::apps
