// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/decode_crop.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "stoker/core/detail/tsan.h"  // parallel_for returns after its chunks
#include "stoker/stages/batch.h"

namespace stoker {

namespace {

std::uint32_t decoded_channels(const DecodeOptions& d) noexcept { return d.color == ImageColor::gray ? 1 : 3; }

// The crop's options with a pool: the stage's outputs come from it.
RandomResizedCropOptions with_pool(RandomResizedCropOptions o) {
  if (!o.pool) o.pool = BufferPool::create();
  return o;
}

}  // namespace

DecodeResizedCrop::DecodeResizedCrop(DecodeResizedCropOptions options)
    : options_(std::move(options)), crop_(with_pool(options_.crop)) {
  options_.crop = crop_.options();
  if (!options_.scratch) options_.scratch = BufferPool::create();
  // Decoders write interleaved pixels: the input of every crop is channels-last.
  const Shape decoded{.channels = decoded_channels(options_.decode), .height = 1, .width = 1, .channels_last = true};
  if (const Normalizer* n = crop_.normalizer()) n->check(decoded, "DecodeResizedCrop");
  shape_ = crop_.output_shape(decoded);
}

DecodedCrop DecodeResizedCrop::decode(std::span<const std::byte> bytes, const std::string& name, std::uint64_t id,
                                      const StageContext& ctx) const {
  const CropSize size = options_.crop.size;
  DecodedCrop c;
  // Called once the header is read: every random draw of the crop, from the image's size alone.
  const auto choose = [&](const ImageInfo& info) {
    c.crop = crop_.plan(info.height, info.width, id, ctx);
    const Window& w = c.crop.window;
    return WindowRequest{.window = {w.x, w.y, w.width, w.height},
                         .min_width = options_.dct_scaling ? size.width : w.width,
                         .min_height = options_.dct_scaling ? size.height : w.height};
  };
  c.decoded = decode_window(bytes, name, *options_.scratch, choose, options_.decode, ctx);
  const DecodedWindow& d = c.decoded;
  c.where = {.scale = static_cast<double>(d.scale_num) / d.scale_denom, .y = d.window.y, .x = d.window.x};
  return c;
}

void DecodeResizedCrop::decode_into(std::span<const std::byte> bytes, const std::string& name, std::uint64_t id,
                                    const StageContext& ctx, std::span<std::byte> out) const {
  resize_into(decode(bytes, name, id, ctx), out);
}

Sample DecodeResizedCrop::operator()(EncodedImage in, const StageContext& ctx) const {
  Sample out;
  out.data = options_.crop.pool->acquire(output_bytes(), ctx);  // with ctx: a pool that waits can be stopped
  out.shape = shape_;
  out.dtype = output_dtype();
  out.label = in.label;
  out.id = in.id;
  decode_into(in.bytes(), in.name, in.id, ctx, {out.data.data(), out.data.size()});
  return out;
}

DeferredResize DecodeCropWindow::operator()(EncodedImage in, const StageContext& ctx) const {
  DeferredResize out{resize_->decode(in.bytes(), in.name, in.id, ctx), resize_};
  out.decoded.label = in.label;
  return out;
}

Batch make_batch(std::vector<DeferredResize>&& crops, Layout layout, const Normalizer* normalize, BufferPool& pool,
                 const StageContext& ctx) {
  const std::vector<DeferredResize> in = std::move(crops);  // released whatever happens
  if (in.empty()) throw std::invalid_argument("make_batch: no crops to batch");
  const auto fail = [](const std::string& what) { throw std::invalid_argument("make_batch: " + what); };
  const auto normalizer_of = [&](const DeferredResize& c) {
    if (!c.resize) fail("a DeferredResize without its DecodeResizedCrop");
    const Normalizer* own = c.resize->crop().normalizer();
    if (own && normalize)
      fail("the crops are normalized by their DecodeResizedCrop already; Collate's normalize would do it twice");
    const auto& own_layout = c.resize->crop().options().layout;
    if (own_layout && *own_layout != layout)
      fail(std::string("the crops are laid out ") + layout_name(*own_layout) + ", the batch " + layout_name(layout));
    return own ? own : normalize;
  };
  const DecodeResizedCrop& first = *in.front().resize;
  Shape shape = first.output_shape();
  shape.channels_last = layout == Layout::channels_last;
  const DType type = normalizer_of(in.front()) ? DType::f32 : DType::u8;
  Batch b = Batch::allocate(pool, shape, type, in.size(), ctx);
  const std::size_t bytes = b.sample_bytes();
  auto labels = b.label_values();
  auto ids = b.id_values();
  std::vector<const Normalizer*> normalizers(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const DeferredResize& c = in[i];
    const Normalizer* n = normalizers[i] = normalizer_of(c);
    if (c.resize->output_shape().elements() != shape.elements() || (n ? DType::f32 : DType::u8) != type)
      fail("crop " + std::to_string(i) + " is " + c.resize->output_shape().str() + " of " +
           dtype_name(n ? DType::f32 : DType::u8) + ", the first " + first.output_shape().str() + " of " +
           dtype_name(type));
    labels[i] = c.decoded.label;
    ids[i] = c.decoded.crop.id;
  }
  // A batch's resizes are most of a collate's work (0.3 ms each for 224x224): in parallel, so that
  // the threads of the arena that have nothing else to do take some (in a pipeline, its own, and
  // only its idle ones: a stage body waits for oneTBB work of its own isolated). Slots are written
  // independently: the batch is the same whatever the threads.
  STOKER_TSAN_RELEASE(&b);
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, in.size(), 4), [&](const tbb::blocked_range<std::size_t>& r) {
    STOKER_TSAN_ACQUIRE(&b);
    for (std::size_t i = r.begin(); i != r.end(); ++i) {
      // The next window was decoded long ago, maybe on another core: ask for it while resizing this one.
      if (i + 1 < r.end()) {
        const Buffer& next = in[i + 1].decoded.decoded.image.data;
        for (std::size_t at = 0; at < next.size(); at += 64) __builtin_prefetch(next.data() + at, 0, 0);
      }
      const DeferredResize& c = in[i];
      const DecodedCrop& d = c.decoded;
      c.resize->crop().apply_into(d.decoded.image, d.where, d.crop, normalizers[i], layout,
                                  {b.data() + i * bytes, bytes});
    }
    STOKER_TSAN_RELEASE(&b);
  });
  STOKER_TSAN_ACQUIRE(&b);
  return b;
}

Batch Collate::operator()(std::vector<DeferredResize> crops, const StageContext& ctx) const {
  return make_batch(std::move(crops), layout, normalize ? &*normalize : nullptr, *pool, ctx);
}

}  // namespace stoker
