#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tests/stages/resized_crop_reference.h: what torchvision and torch themselves give, for
test_image_transforms to compare stoker against without Python at test time.

- RandomResizedCrop.get_params (torchvision's own code) drawn `DRAWS` times per image size: the
  histograms of the windows' scale, log aspect ratio and position.
- torch.nn.functional.interpolate(mode="bilinear", align_corners=False) of small float images
  cropped first, with antialias on and off: the values a resize must give.

Run by hand with Debian's python3-torchvision: /usr/bin/python3 tests/stages/resized_crop_reference.py
"""
import math
import sys

import torch
import torch.nn.functional as F
import torchvision.transforms as T

DRAWS = 250_000
SIZES = [(375, 500), (64, 64), (40, 300), (500, 160)]  # (height, width)
SCALE_BINS, RATIO_BINS, POSITION_BINS = 20, 16, 10
RATIO_LO, RATIO_HI = -0.4, 0.4


def clamp_bin(b, n):
    return min(max(b, 0), n - 1)


def histograms(height, width):
    img = torch.empty(1, height, width)
    scale = [0] * SCALE_BINS
    ratio = [0] * RATIO_BINS
    rows = [0] * POSITION_BINS
    cols = [0] * POSITION_BINS
    for _ in range(DRAWS):
        i, j, h, w = T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0])
        assert 0 <= i and i + h <= height and 0 <= j and j + w <= width
        scale[clamp_bin(int(h * w / (height * width) * SCALE_BINS), SCALE_BINS)] += 1
        r = (math.log(w / h) - RATIO_LO) / (RATIO_HI - RATIO_LO)
        ratio[clamp_bin(int(r * RATIO_BINS), RATIO_BINS)] += 1
        rows[clamp_bin(int((i + 0.5) / (height - h + 1) * POSITION_BINS), POSITION_BINS)] += 1
        cols[clamp_bin(int((j + 0.5) / (width - w + 1) * POSITION_BINS), POSITION_BINS)] += 1
    return scale, ratio, rows, cols


def pattern(height, width, channels):
    # Integer pixels with structure in both directions, as a decoder would give.
    return torch.tensor([[[float((37 * y + 11 * x * x + 53 * c + 7 * x * y) % 256) for x in range(width)]
                          for y in range(height)] for c in range(channels)]).unsqueeze(0)


# (image height, width, window y, x, height, width, output height, width, antialias)
RESIZES = [
    (13, 17, 2, 3, 9, 11, 4, 5, True),    # shrink 2.25 x 2.2
    (13, 17, 2, 3, 9, 11, 4, 5, False),
    (13, 17, 0, 0, 13, 17, 3, 7, True),   # the whole image, unequal factors
    (13, 17, 4, 1, 5, 6, 11, 9, True),    # enlarge: antialias changes nothing
    (13, 17, 4, 1, 5, 6, 11, 9, False),
    (40, 30, 5, 2, 33, 27, 5, 6, True),   # shrink 6.6 x 4.5: wide filters
]


def floats(values):
    def literal(v):
        text = f"{v:.9g}"
        return text + ("f" if any(ch in text for ch in ".e") else ".0f")
    return ", ".join(literal(v) for v in values)


def main():
    out = [
        "// Written by resized_crop_reference.py with torch " + torch.__version__ + " and torchvision's",
        "// RandomResizedCrop.get_params; do not edit.",
        "// clang-format off",
        "#pragma once",
        "#include <array>",
        "#include <cstdint>",
        "#include <vector>",
        "namespace reference {",
        f"inline constexpr int kDraws = {DRAWS};",
        f"inline constexpr int kScaleBins = {SCALE_BINS}, kRatioBins = {RATIO_BINS}, kPositionBins = {POSITION_BINS};",
        f"inline constexpr double kRatioLo = {RATIO_LO}, kRatioHi = {RATIO_HI};",
        "struct WindowHistograms {",
        "  std::uint32_t height, width;",
        "  std::array<std::uint32_t, kScaleBins> scale;",
        "  std::array<std::uint32_t, kRatioBins> ratio;",
        "  std::array<std::uint32_t, kPositionBins> rows, cols;",
        "};",
        "inline const std::vector<WindowHistograms> kWindows = {",
    ]
    torch.manual_seed(27)
    for height, width in SIZES:
        s, r, y, x = histograms(height, width)
        out.append(f"    {{{height}, {width}, {{{', '.join(map(str, s))}}}, {{{', '.join(map(str, r))}}},")
        out.append(f"     {{{', '.join(map(str, y))}}}, {{{', '.join(map(str, x))}}}}},")
        print(f"{height}x{width} done", file=sys.stderr)
    out.append("};")
    out += [
        "struct Resize {",
        "  std::uint32_t height, width, y, x, window_height, window_width, out_height, out_width;",
        "  bool antialias;",
        "  std::vector<float> expected;  // (3, out_height, out_width), of pattern(height, width, 3)",
        "};",
        "inline const std::vector<Resize> kResizes = {",
    ]
    for (h, w, y, x, wh, ww, oh, ow, aa) in RESIZES:
        img = pattern(h, w, 3)[:, :, y:y + wh, x:x + ww]
        res = F.interpolate(img, size=(oh, ow), mode="bilinear", align_corners=False, antialias=aa)
        out.append(f"    {{{h}, {w}, {y}, {x}, {wh}, {ww}, {oh}, {ow}, {'true' if aa else 'false'},")
        out.append(f"     {{{floats(res.flatten().tolist())}}}}},")
    out.append("};")
    out.append("}  // namespace reference")
    print("\n".join(out))


if __name__ == "__main__":
    main()
