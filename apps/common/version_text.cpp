// SPDX-License-Identifier: Apache-2.0
#include "version_text.h"

#include <cstdio>  // jconfig.h and jpeglib.h need it first

#include <jconfig.h>
#include <spng.h>

#include "stoker/config.h"
#include "stoker/version.h"
#include "stoker_commit.h"  // generated at every build (cmake/commit.cmake)

namespace stoker::apps {

namespace {
#define STOKER_TEXT(x) #x
#define STOKER_VALUE_TEXT(x) STOKER_TEXT(x)
// The versions the image decoders were built against (stages/: JPEG, PNG).
constexpr const char* kImageDecoders =
    "JPEG (libjpeg-turbo " STOKER_VALUE_TEXT(LIBJPEG_TURBO_VERSION) "), PNG (libspng " STOKER_VALUE_TEXT(
        SPNG_VERSION_MAJOR) "." STOKER_VALUE_TEXT(SPNG_VERSION_MINOR) "." STOKER_VALUE_TEXT(SPNG_VERSION_PATCH) ")";
#undef STOKER_VALUE_TEXT
#undef STOKER_TEXT
}  // namespace

std::string version_text(const std::string& program) {
  std::string text = program + " " + STOKER_VERSION_STRING;
  if (*STOKER_COMMIT != '\0') text += std::string(" (commit ") + STOKER_COMMIT + ")";
  return text + "\nbuilt with: " + STOKER_BUILD_FEATURES + "\nimage decoders: " + kImageDecoders +
         "\nlicense: Apache-2.0";
}

}  // namespace stoker::apps
