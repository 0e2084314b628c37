// SPDX-License-Identifier: Apache-2.0
// Tar listing and index parsing over any file, local or remote. Private to stoker_stages.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "file_io.h"
#include "stoker/stages/tar.h"

namespace stoker::detail {

/// list_tar() of an archive read through `file`: one read per member's header.
std::vector<TarMember> list_tar(const RandomAccessFile& file);

/// read_wds_index() of an index's bytes; `name` is the index's, for errors.
std::vector<TarMember> parse_wds_index(std::span<const std::byte> bytes, const std::string& name);

}  // namespace stoker::detail
