// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpus of fuzz_image into the folder given: small JPEGs of every kind the
// decoder takes (baseline, progressive, gray, CMYK, each chroma subsampling) and PNGs of 1 to 4
// channels, made with stoker's own encoders.
#include <cstdio>
#include <fstream>
#include <string>

#include "stoker/stages/image_encode.h"

int main(int argc, char** argv) {
  using namespace stoker;
  if (argc != 2) {
    std::fprintf(stderr, "usage: image_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  auto pool = BufferPool::create();
  const auto image = [&](std::uint32_t h, std::uint32_t w, std::uint32_t c) {
    Sample s(*pool, {.channels = c, .height = h, .width = w, .channels_last = true}, DType::u8);
    for (std::size_t i = 0; i < s.data.size(); ++i) s.data.data()[i] = static_cast<std::byte>(i * 37 / 5 + i / 13);
    return s;
  };
  const auto save = [&](const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  save("baseline420.jpg", encode_jpeg(image(19, 23, 3), {.quality = 75}));
  save("baseline422.jpg", encode_jpeg(image(17, 16, 3), {.quality = 90, .subsampling = ChromaSubsampling::s422}));
  save("baseline444.jpg", encode_jpeg(image(9, 31, 3), {.quality = 95, .subsampling = ChromaSubsampling::s444}));
  save("progressive.jpg", encode_jpeg(image(21, 18, 3), {.quality = 80, .progressive = true}));
  save("gray.jpg", encode_jpeg(image(12, 10, 1), {.quality = 85}));
  save("cmyk.jpg", encode_jpeg(image(8, 9, 4), {.quality = 90}));
  for (std::uint32_t c = 1; c <= 4; ++c) save("c" + std::to_string(c) + ".png", encode_png(image(7, 11, c)));
  return 0;
}
