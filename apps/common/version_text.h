// SPDX-License-Identifier: Apache-2.0
// What every stoker program prints for --version. Private to apps/.
#pragma once

#include <string>

namespace stoker::apps {

/// "stoker-train 0.1.0 (commit 917c650d2f1a)", then what the build has (CUDA, MPI, the image
/// decoders) and the license, one per line. The commit is the source tree's when it was built,
/// with "-dirty" for uncommitted changes; left out when the tree was not a git checkout.
std::string version_text(const std::string& program);

}  // namespace stoker::apps
