// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/raw.h"

#include "file_io.h"

namespace stoker {

RawVolumeReader::RawVolumeReader(const std::filesystem::path& file, Shape shape, DType dtype, ReaderOptions options,
                                 std::int32_t label)
    : Reader(std::move(options)), shape_(shape), dtype_(dtype), label_(label) {
  if (shape_.elements() == 0) throw std::invalid_argument("RawVolumeReader: shape " + shape_.str() + " is empty");
  if (!shape_.volume && shape_.depth != 1)
    throw std::invalid_argument("RawVolumeReader: shape " + shape_.str() + " has depth " +
                                std::to_string(shape_.depth) + " but is not marked as a volume");
  file_ = std::make_shared<const detail::InputFile>(file);
  const std::uint64_t size = file_->size(), each = volume_bytes();
  // A partial volume at the end means the shape or dtype given does not match the file:
  // better to say so than to drop the remainder or read garbage.
  if (size == 0 || size % each != 0)
    throw DataError(file_->name(), "size " + std::to_string(size) + " bytes is not a whole number of " + shape_.str() +
                                       " " + dtype_name(dtype_) + " volumes of " + std::to_string(each) +
                                       " bytes each");
  count_ = size / each;
}

Sample RawVolumeReader::read(std::uint64_t id) const {
  check_id(id);
  Sample sample(*pool(), shape_, dtype_, label_, id);
  file_->read_at(id * volume_bytes(), {sample.data.data(), sample.data.size()});
  return sample;
}

}  // namespace stoker
