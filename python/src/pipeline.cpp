// SPDX-License-Identifier: Apache-2.0
// PipelineBuilder and Pipeline for Python: the C++ builder, typed by each stage's output, driven
// by stages chosen at run time.
//
// A Python pipeline carries items of a closed set of types (Items). The builder holds the C++
// builder of whichever type its last stage gives; each step dispatches on that type and on the
// stage function's class, and makes the C++ builder of the step's output, or raises a TypeError
// naming both stages when the function cannot take the items. Once built, a pipeline of C++
// stage functions is the C++ pipeline itself: no Python runs until the consumer takes an item.
//
// Adding a stage function: bind its class (stages.cpp, gpu.cpp) and name it in Sources, Maps or
// FlatMaps below; its input and output types are found from its call operators. A new item type
// goes in Items, with a to_python() (binding.h) and a name (item_name).
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

#include "binding.h"
#include "stoker/core/pipeline.h"
#include "stoker/gpu/augment.h"
#include "stoker/stages/decode_crop.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/image_transforms.h"
#include "stoker/stages/mix.h"
#include "stoker/stages/npy.h"
#include "stoker/stages/raw.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"

namespace stoker::python {

namespace {

template <class... T>
struct Types {};

template <class T, class... U>
constexpr bool one_of(Types<U...>) {
  return (std::is_same_v<T, U> || ...);
}
template <class... T, class F>
void for_each_type(Types<T...>, F&& f) {
  (f.template operator()<T>(), ...);
}

template <class B>
struct item_of;
template <class T>
struct item_of<Builder<T>> {
  using type = T;
};

// What a Python pipeline carries between its stages.
using Items = Types<Sample, DeferredCrop, std::vector<Sample>, std::vector<DeferredCrop>, EncodedImage, DeferredResize,
                    std::vector<DeferredResize>, Batch, gpu::DeviceBatch, Object, std::vector<Object>>;
// The C++ stage functions a Python pipeline runs, by the step that takes them.
using Sources =
    Types<IdxReader, NpyReader, RawVolumeReader, SyntheticSource, ShuffledShard, ImageSource, MixedImageSource>;
using Maps = Types<CenterCrop, RandomMirror, Normalize, Collate, ImageDecoder, DecodeCropWindow, DecodeResizedCrop,
                   RandomResizedCrop, Resize, gpu::ToDevice>;
using FlatMaps = Types<RandomCrops, gpu::GpuAugment>;

template <class T>
struct is_list : std::false_type {};
template <class T>
struct is_list<std::vector<T>> : std::true_type {};

template <class T>
std::string item_name() {
  if constexpr (is_list<T>::value)
    return "list of " + item_name<typename T::value_type>();
  else if constexpr (std::is_same_v<T, Sample>)
    return "Sample";
  else if constexpr (std::is_same_v<T, DeferredCrop>)
    return "DeferredCrop";
  else if constexpr (std::is_same_v<T, EncodedImage>)
    return "EncodedImage";
  else if constexpr (std::is_same_v<T, DeferredResize>)
    return "DeferredResize";
  else if constexpr (std::is_same_v<T, Batch>)
    return "Batch";
  else if constexpr (std::is_same_v<T, gpu::DeviceBatch>)
    return "DeviceBatch";
  else
    return "Python object";
}

// The Python class that names an item type in flat_map(output=...); none for Python items.
template <class T>
py::object python_type() {
  if constexpr (std::is_same_v<T, Sample>)
    return py::type::of<Sample>();
  else if constexpr (std::is_same_v<T, DeferredCrop>)
    return py::type::of<DeferredCrop>();
  else if constexpr (std::is_same_v<T, EncodedImage>)
    return py::type::of<EncodedImage>();
  else if constexpr (std::is_same_v<T, DeferredResize>)
    return py::type::of<DeferredResize>();
  else if constexpr (std::is_same_v<T, Batch>)
    return py::type::of<BatchView>();
  else if constexpr (std::is_same_v<T, gpu::DeviceBatch>)
    return py::type::of<DeviceBatchView>();
  else
    return py::none();
}

template <class F, class T>
concept Takes = std::is_invocable_v<F&, T, const StageContext&> || std::is_invocable_v<F&, T>;
template <class F, class T, class U>
concept Emits = std::is_invocable_v < F&,
        T, Emitter<U>
&, const StageContext& > || std::is_invocable_v<F&, T, Emitter<U>&>;
template <class F, class T, class... U>
constexpr bool emits_any(Types<U...>) {
  return (Emits<F, T, U> || ...);
}

// flat_map's output when the call names none: the first type in Items the function emits,
// unless it says otherwise here. RandomCrops defers its crops to Collate unless it normalizes
// them itself, which deferred crops cannot.
template <class F>
const std::type_info* preferred_output(const F&) {
  return nullptr;
}
const std::type_info* preferred_output(const RandomCrops& f) {
  return f.normalizer() ? &typeid(Sample) : &typeid(DeferredCrop);
}

std::string class_name(const py::handle& fn) { return py::str(py::type::handle_of(fn).attr("__name__")); }

// ---------------------------------------------------------------------------------------------
// Python functions as stage functions. Each holds the GIL while it runs: its stage's bodies run
// one at a time whatever its threads, and the time they wait for the GIL is their stage's busy
// time in the summary. Their items are Python objects (Object).

template <class T>
struct PythonMap {
  std::shared_ptr<Object> fn;
  std::shared_ptr<const ExportOptions> to;
  Object operator()(T in) const {
    py::gil_scoped_acquire gil;
    return python_errors([&] { return Object(fn->get()(to_python(std::move(in), *to))); });
  }
};

template <class T>
struct PythonFlatMap {
  std::shared_ptr<Object> fn;
  std::shared_ptr<const ExportOptions> to;
  void operator()(T in, Emitter<Object>& emit) const {
    std::vector<Object> out;
    {
      py::gil_scoped_acquire gil;
      python_errors([&] {
        for (const py::handle x : fn->get()(to_python(std::move(in), *to)))
          out.emplace_back(py::reinterpret_borrow<py::object>(x));
      });
    }
    for (Object& x : out) emit(std::move(x));  // without the GIL: an emit may wait for room downstream
  }
};

struct PythonSource {
  std::shared_ptr<Object> fn;
  std::optional<Object> operator()() const {
    py::gil_scoped_acquire gil;
    return python_errors([&]() -> std::optional<Object> {
      py::object x = fn->get()();
      if (x.is_none()) return std::nullopt;
      return Object(std::move(x));
    });
  }
};

std::shared_ptr<Object> hold(const py::object& fn) { return std::make_shared<Object>(fn); }

// Items per epoch of a pipeline's last stage, as a function of the epoch (a source cut for a
// resume gives fewer in its first), or why it is not known. Stages that skip items on errors
// give fewer: it counts what they would give without.
struct Length {
  std::function<std::uint64_t(std::uint32_t)> of;  // empty: unknown
  std::string why;

  static Length unknown(std::string why) { return {{}, std::move(why)}; }
  static Length fixed(std::uint64_t n) {
    return {[n](std::uint32_t) { return n; }, {}};
  }
  Length then(std::function<std::uint64_t(std::uint64_t)> f) const {
    if (!of) return *this;
    return {[g = of, f = std::move(f)](std::uint32_t epoch) { return f(g(epoch)); }, {}};
  }
  std::uint64_t at(std::uint32_t epoch) const {
    if (!of) throw py::type_error("len(): " + why);
    return of(epoch);
  }
};

template <class F>
Length source_length(const F& f) {
  if constexpr (std::is_same_v<F, ImageSource>)
    return {[f](std::uint32_t epoch) { return f.size_of(epoch); }, {}};
  else if constexpr (std::is_same_v<F, MixedImageSource>) {
    // Drawn until the first data set runs out, an epoch's length depends on the seed.
    if (f.options().stop == MixStop::first_exhausted)
      return Length::unknown(
          "a MixedImageSource with stop 'first_exhausted' has epochs whose length depends on the pipeline's seed "
          "(MixedImageSource.size_of(seed, epoch) says it)");
    return {[f](std::uint32_t epoch) { return f.size_of(0, epoch); }, {}};
  } else
    return Length::fixed(f.size());
}

// ---------------------------------------------------------------------------------------------
// The built pipeline

// Ctrl-C is looked for this often while the consumer waits.
constexpr auto kSignalCheck = std::chrono::milliseconds(50);

class AnyPipeline {
 public:
  virtual ~AnyPipeline() = default;
  /// The next item in its Python form, or None at the end of an epoch and of the run. With the
  /// GIL held; releases it while it waits, in slices, checking for signals between them.
  virtual py::object next() = 0;
  /// stop(), summary() and state() with the GIL released: they may wait for the stages.
  virtual void stop() = 0;
  virtual PipelineSummary summary() const = 0;
  virtual PipelineState state() const = 0;
  virtual bool finished() const = 0;
  virtual std::uint32_t current_epoch() const = 0;
};

template <class T>
class TypedPipeline final : public AnyPipeline {
 public:
  TypedPipeline(Pipeline<T> pipe, std::shared_ptr<const ExportOptions> to)
      : pipe_(std::move(pipe)), to_(std::move(to)) {}

  py::object next() override {
    std::optional<T> item;
    for (;;) {
      bool ready = false;
      {
        py::gil_scoped_release nogil;  // before the lock: its holder may need the GIL to go on
        std::lock_guard consumer(consumer_);
        ready = pipe_.wait_for(kSignalCheck);
        if (ready) item = pipe_.next();
      }
      if (ready) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // KeyboardInterrupt; nothing taken
    }
    if (!item) return py::none();
    return to_python(std::move(*item), *to_);
  }
  void stop() override { pipe_.stop(); }
  PipelineSummary summary() const override { return pipe_.summary(); }
  PipelineState state() const override {
    std::lock_guard consumer(consumer_);
    return pipe_.state();
  }
  bool finished() const override { return pipe_.finished(); }
  std::uint32_t current_epoch() const override { return pipe_.current_epoch(); }

 private:
  Pipeline<T> pipe_;
  std::shared_ptr<const ExportOptions> to_;
  // A pipeline has one consumer at a time: Python threads that share one take turns.
  mutable std::mutex consumer_;
};

double seconds(std::chrono::nanoseconds ns) { return std::chrono::duration<double>(ns).count(); }

// stoker.Pipeline.
class PythonPipeline {
 public:
  PythonPipeline(std::unique_ptr<AnyPipeline> pipe, std::set<std::string> python_stages, Length length,
                 std::uint64_t consumed)
      : pipe_(std::move(pipe)),
        python_stages_(std::move(python_stages)),
        length_(std::move(length)),
        consumed_(consumed) {
    live().insert(this);
  }
  PythonPipeline(const PythonPipeline&) = delete;
  PythonPipeline& operator=(const PythonPipeline&) = delete;
  // Its stages' bodies may need the GIL to finish (Python stages, Python items in its queues).
  ~PythonPipeline() {
    live().erase(this);
    py::gil_scoped_release nogil;
    pipe_.reset();
  }

  py::object next() {
    py::object item = pipe_->next();
    if (item.is_none())
      consumed_ = 0;  // the end of an epoch (or of the run)
    else
      ++consumed_;
    return item;
  }
  /// Items of the current epoch, whole, and those it has left.
  std::uint64_t epoch_length() const { return length_.at(pipe_->current_epoch()); }
  std::uint64_t left() const {
    const std::uint64_t n = epoch_length();
    return pipe_->finished() ? 0 : n - std::min(n, consumed_);
  }
  void stop() {
    py::gil_scoped_release nogil;
    pipe_->stop();
  }
  bool finished() const { return pipe_->finished(); }
  std::uint32_t current_epoch() const { return pipe_->current_epoch(); }
  std::string state() const {
    py::gil_scoped_release nogil;
    return pipe_->state().to_json();
  }
  py::dict summary() const {
    PipelineSummary s;
    {
      py::gil_scoped_release nogil;
      s = pipe_->summary();
    }
    py::list stages;
    for (const StageStats& st : s.stages)
      stages.append(py::dict(py::arg("name") = st.name, py::arg("threads") = st.threads,
                             py::arg("items_in") = st.items_in, py::arg("items_out") = st.items_out,
                             py::arg("skipped") = st.skipped, py::arg("busy_s") = seconds(st.busy),
                             py::arg("starved_s") = seconds(st.starved), py::arg("blocked_s") = seconds(st.blocked),
                             py::arg("python") = python_stages_.contains(st.name)));
    py::list queues;
    for (const QueueReport& q : s.queues)
      queues.append(py::dict(py::arg("name") = q.name, py::arg("producer") = q.producer,
                             py::arg("consumer") = q.consumer, py::arg("capacity") = q.capacity,
                             py::arg("size") = q.size, py::arg("empty_s") = seconds(q.time_empty),
                             py::arg("full_s") = seconds(q.time_full), py::arg("lifetime_s") = seconds(q.lifetime)));
    py::dict counters;
    for (const Counter& c : s.counters) counters[py::str(c.name)] = c.value;
    return py::dict(py::arg("wall_s") = seconds(s.wall), py::arg("consumer_wait_s") = seconds(s.consumer_wait),
                    py::arg("consumed") = s.consumed, py::arg("threads") = s.threads, py::arg("stages") = stages,
                    py::arg("queues") = queues, py::arg("counters") = counters);
  }
  std::string summary_table() const {
    PipelineSummary s;
    {
      py::gil_scoped_release nogil;
      s = pipe_->summary();
    }
    std::ostringstream out;
    print_summary(out, s);
    return out.str();
  }

  /// Stops every pipeline still alive: at the interpreter's exit, before it stops lending the
  /// GIL to other threads, which Python stages would need to finish.
  static void stop_all() {
    const std::vector<PythonPipeline*> all(live().begin(), live().end());
    for (PythonPipeline* p : all) p->stop();
  }

 private:
  // Guarded by the GIL.
  static std::set<PythonPipeline*>& live() {
    static std::set<PythonPipeline*> pipelines;
    return pipelines;
  }
  std::unique_ptr<AnyPipeline> pipe_;
  std::set<std::string> python_stages_;
  Length length_;
  std::uint64_t consumed_ = 0;  // items next() returned in the current epoch
};

// ---------------------------------------------------------------------------------------------
// The builder

template <class... T>
using BuilderOf = std::variant<PipelineBuilder, Builder<T>...>;
template <class... T>
BuilderOf<T...> builder_of(Types<T...>);
using AnyBuilder = decltype(builder_of(Items{}));

struct Step {
  std::string name;
  const py::object& fn;
};

// stoker.PipelineBuilder: option setters and steps change it and return it, as the C++ chain.
class PythonBuilder {
 public:
  template <class F>
  void option(F&& f) {
    std::visit([&](auto& b) { f(b); }, b_);
  }

  void source(const Step& s, SourceOptions o) {
    auto* start = std::get_if<PipelineBuilder>(&b_);
    if (start == nullptr)
      throw py::value_error("source '" + s.name + "': a pipeline has one source, its first stage ('" + first_ + "')");
    std::optional<AnyBuilder> next;
    for_each_type(Sources{}, [&]<class F>() {
      if (next || !py::isinstance<F>(s.fn)) return;
      const F& f = s.fn.cast<const F&>();
      length_ = source_length(f);
      next.emplace(start->source(s.name, f, o));
    });
    if (!next) {
      if (!PyCallable_Check(s.fn.ptr()))
        throw py::type_error("source '" + s.name + "': a " + class_name(s.fn) +
                             " is not a source (a reader, a ShuffledShard, an ImageSource, a MixedImageSource, or a "
                             "Python callable)");
      length_ = py::hasattr(s.fn, "__len__") ? Length::fixed(py::len(s.fn))
                                             : Length::unknown("the source '" + s.name +
                                                               "' is a Python callable without __len__: how many "
                                                               "items an epoch has is not known");
      next.emplace(start->source(s.name, PythonSource{hold(s.fn)}, o));
      python_stages_.insert(s.name);
    }
    set(s.name, std::move(*next));
    first_ = s.name;
  }

  void map(const Step& s, StageOptions o) {
    transform(s, "map", [&]<class T>(Builder<T>& b) -> AnyBuilder {
      std::optional<AnyBuilder> next;
      for_each_type(Maps{}, [&]<class F>() {
        if (next || !py::isinstance<F>(s.fn)) return;
        if constexpr (Takes<F, T>)
          next.emplace(b.map(s.name, s.fn.cast<const F&>(), o));
        else
          mismatch<T>(s, "map", [&]<class U>() { return Takes<F, U>; });
      });
      if (next) return std::move(*next);
      python_function(s, "map");
      o.autotune = false;  // more threads cannot run it faster
      return b.map(s.name, PythonMap<T>{hold(s.fn), to_}, o);
    });
  }

  void flat_map(const Step& s, const py::object& output, StageOptions o) {
    if (o.fanout > 0)
      length_ = length_.then([k = o.fanout](std::uint64_t n) { return n * k; });
    else if (py::isinstance<RandomCrops>(s.fn))
      length_ = length_.then([k = s.fn.cast<const RandomCrops&>().options().count](std::uint64_t n) {
        return n * static_cast<std::uint64_t>(k);
      });
    else
      length_ = Length::unknown("flat_map '" + s.name +
                                "' gives a number of items per input that stoker cannot "
                                "know: fanout=k says it");
    transform(s, "flat_map", [&]<class T>(Builder<T>& b) -> AnyBuilder {
      std::optional<AnyBuilder> next;
      for_each_type(FlatMaps{}, [&]<class F>() {
        if (!next && py::isinstance<F>(s.fn)) next.emplace(flat_map_with<T>(b, s, s.fn.cast<const F&>(), output, o));
      });
      if (next) return std::move(*next);
      python_function(s, "flat_map");
      o.autotune = false;
      return b.template flat_map<Object>(s.name, PythonFlatMap<T>{hold(s.fn), to_}, o);
    });
  }

  void shuffle(const std::string& name, const ShuffleOptions& o) {
    std::visit(
        [&]<class B>(B& b) {
          if constexpr (std::is_same_v<B, PipelineBuilder>)
            throw py::value_error("shuffle '" + name + "': a pipeline starts with its source");
          else
            b.shuffle(name, o);
        },
        b_);
  }

  void batch(const std::string& name, std::size_t size, BatchOptions o) {
    length_ = length_.then(
        [size, drop = o.drop_remainder](std::uint64_t n) { return drop ? n / size : (n + size - 1) / size; });
    const py::object none = py::none();
    transform(Step{name, none}, "batch", [&]<class T>(Builder<T>& b) -> AnyBuilder {
      if constexpr (one_of<std::vector<T>>(Items{}))
        return b.batch(name, size, o);
      else
        throw py::type_error("batch '" + name + "': the items of '" + last_ + "' are " + item_name<T>() +
                             ", which a Python pipeline does not batch (it batches Sample, DeferredCrop, "
                             "DeferredResize and Python objects)");
    });
  }

  std::unique_ptr<PythonPipeline> build(std::optional<LabelType> labels) {
    std::unique_ptr<AnyPipeline> pipe;
    std::visit(
        [&]<class B>(B& b) {
          if constexpr (std::is_same_v<B, PipelineBuilder>) {
            throw py::value_error("build(): the pipeline has no source");
          } else {
            using T = typename item_of<B>::type;
            constexpr bool device = std::is_same_v<T, gpu::DeviceBatch>;
            if (device && labels == LabelType::i64)
              throw py::value_error("build(labels='int64'): the last stage, '" + last_ +
                                    "', gives device batches, whose labels are int32 only");
            *to_ = ExportOptions{.labels = labels.value_or(device ? LabelType::i32 : LabelType::i64)};
            // Stages start at once, and a Python stage needs the GIL to.
            py::gil_scoped_release nogil;
            pipe = std::make_unique<TypedPipeline<T>>(b.build(), to_);
          }
        },
        b_);
    return std::make_unique<PythonPipeline>(std::move(pipe), python_stages_, length_, resumed_consumed_);
  }

  /// Where resume_from(state) starts the epoch: how many of its items were taken.
  void resumed_at(std::uint64_t consumed) { resumed_consumed_ = consumed; }
  std::string describe() const {
    return "stoker.PipelineBuilder(" +
           (first_.empty() ? std::string("no source yet") : "'" + first_ + "' ... '" + last_ + "'") + ")";
  }

 private:
  void set(const std::string& name, AnyBuilder next) {
    b_ = std::move(next);
    last_ = name;
  }

  // A step that takes the last stage's items: `f(builder)` for its typed builder.
  template <class F>
  void transform(const Step& s, const char* step, F&& f) {
    AnyBuilder next = std::visit(
        [&]<class B>(B& b) -> AnyBuilder {
          if constexpr (std::is_same_v<B, PipelineBuilder>)
            throw py::value_error(std::string(step) + " '" + s.name + "': a pipeline starts with its source");
          else
            return f(b);
        },
        b_);
    set(s.name, std::move(next));
  }

  template <class T, class F>
  AnyBuilder flat_map_with(Builder<T>& b, const Step& s, const F& f, const py::object& output, const StageOptions& o) {
    const std::type_info* preferred = output.is_none() ? preferred_output(f) : nullptr;
    std::optional<AnyBuilder> next;
    std::string gives;
    for_each_type(Items{}, [&]<class U>() {
      if constexpr (Emits<F, T, U>) {
        gives += (gives.empty() ? "" : " or ") + item_name<U>();
        const bool chosen =
            output.is_none() ? preferred == nullptr || *preferred == typeid(U) : output.is(python_type<U>());
        if (!next && chosen) next.emplace(b.template flat_map<U>(s.name, f, o));
      }
    });
    if (next) return std::move(*next);
    if (gives.empty()) mismatch<T>(s, "flat_map", [&]<class U>() { return emits_any<F, U>(Items{}); });
    throw py::type_error("flat_map '" + s.name + "': " + class_name(s.fn) + " gives " + gives + " from " +
                         item_name<T>() + ", not " + py::repr(output).cast<std::string>());
  }

  // Raises the TypeError for a function that cannot take the last stage's items (of type T),
  // naming what it takes (`takes<U>()`), and how to get there where a step would.
  template <class T, class Takes>
  [[noreturn]] void mismatch(const Step& s, const char* step, Takes&& takes) const {
    std::string can;
    bool list_of_these = false;
    for_each_type(Items{}, [&]<class U>() {
      if (!takes.template operator()<U>()) return;
      can += (can.empty() ? "" : " or ") + item_name<U>();
      if constexpr (std::is_same_v<U, std::vector<T>>) list_of_these = true;
    });
    throw py::type_error(std::string(step) + " '" + s.name + "': " + class_name(s.fn) + " takes " + can + ", but '" +
                         last_ + "' gives " + item_name<T>() +
                         (list_of_these ? " (a .batch() before it makes lists)" : ""));
  }

  void python_function(const Step& s, const char* step) {
    if (!PyCallable_Check(s.fn.ptr()))
      throw py::type_error(std::string(step) + " '" + s.name + "': a " + class_name(s.fn) +
                           " is not a stage function (a stoker transform, or a Python callable)");
    python_stages_.insert(s.name);
  }

  AnyBuilder b_{PipelineBuilder{}};
  std::string first_, last_;
  std::set<std::string> python_stages_;
  Length length_ = Length::unknown("the pipeline has no source");
  std::uint64_t resumed_consumed_ = 0;
  // How batches reach Python stages and the consumer: set by build(), read after.
  std::shared_ptr<ExportOptions> to_ = std::make_shared<ExportOptions>();
};

StageOptions stage_options(int threads, std::size_t queue, std::size_t max_chunk, std::string_view on_error,
                           bool copy_per_body, bool autotune, std::size_t fanout = 0) {
  return {.threads = threads,
          .queue = queue,
          .max_chunk = max_chunk,
          .on_error = parse_on_error(on_error),
          .copy_per_body = copy_per_body,
          .autotune = autotune,
          .fanout = fanout};
}

// Option setters and steps return the builder itself, so that calls chain as in C++:
// chained(f), for f(PythonBuilder&, Args...), is the method f(self, Args...) returning self. A
// reference to an object Python already holds comes back as that same object, and the signature
// (and the type stubs) name its class.
template <class F, class... Args>
auto chained(F f, void (F::*)(PythonBuilder&, Args...) const) {
  return [f](PythonBuilder& self, Args... args) -> PythonBuilder& {
    f(self, std::forward<Args>(args)...);
    return self;
  };
}
template <class F>
auto chained(F f) {
  return chained(f, &F::operator());
}

// for batch in pipe.epoch(), and for epoch in pipe.epochs().
struct EpochIterator {
  py::object pipe;
  bool ended = false;
  py::object next() {
    if (ended) throw py::stop_iteration();
    py::object item = pipe.cast<PythonPipeline&>().next();
    if (item.is_none()) {
      ended = true;  // a later next() would start the next epoch
      throw py::stop_iteration();
    }
    return item;
  }
  std::uint64_t left() const { return ended ? 0 : pipe.cast<const PythonPipeline&>().left(); }
};
struct EpochsIterator {
  py::object pipe;
  EpochIterator next() {
    if (pipe.cast<PythonPipeline&>().finished()) throw py::stop_iteration();
    return EpochIterator{pipe};
  }
};

}  // namespace

void bind_pipeline(py::module_& m) {
  // The classes the builder's signatures name, before them.
  py::class_<PythonPipeline> pipeline(m, "Pipeline", R"(A running pipeline. The thread that iterates it is its
consumer. While it waits for an item it releases the GIL and checks for signals every 50 ms,
so Ctrl-C raises KeyboardInterrupt (the item is not taken). Use it in a `with` block, or call
stop(), to stop its threads.)");
  py::class_<EpochIterator> epoch(m, "Epoch", "The rest of an epoch: an iterator of its items.");
  py::class_<EpochsIterator> epochs(m, "Epochs", "The epochs until the run is over.");

  py::class_<ThreadBudget, std::shared_ptr<ThreadBudget>>(m, "ThreadBudget", R"(One thread budget for several
pipelines (PipelineBuilder.budget, ImageLoader's budget): together they run at most `threads`
stage calls at once, e.g. a training and an evaluation loader on one machine's cores. A
pipeline nobody iterates holds none of its turns. 0 = one per core.)")
      .def(py::init<int>(), py::arg("threads") = 0)
      .def_property_readonly("threads", &ThreadBudget::threads, "Stage calls that may run at once.")
      .def_property_readonly("running", &ThreadBudget::running, "Those running now.")
      .def_property_readonly("waiting", &ThreadBudget::waiting, "Stage bodies waiting for a turn now.")
      .def("__repr__",
           [](const ThreadBudget& b) { return "ThreadBudget(threads=" + std::to_string(b.threads()) + ")"; });

  py::class_<PythonBuilder>(m, "PipelineBuilder", R"(Builds a pipeline as the C++ builder does: options, then a
source, then map / flat_map / shuffle / batch steps, then build(). Every call returns the
builder. Stage functions are stoker's classes (run in C++, on the pipeline's threads) or
Python callables (which hold the GIL: one call at a time, whatever their threads).)")
      .def(py::init<>())
      .def("threads", chained([](PythonBuilder& b, int n) { b.option([&](auto& x) { x.threads(n); }); }), py::arg("n"),
           "The pipeline's own threads; 0 = one per core.")
      .def("budget",
           chained([](PythonBuilder& b, std::shared_ptr<ThreadBudget> t) { b.option([&](auto& x) { x.budget(t); }); }),
           py::arg("budget"), "A ThreadBudget shared with other pipelines; threads then default to its.")
      .def("seed", chained([](PythonBuilder& b, std::uint64_t s) { b.option([&](auto& x) { x.seed(s); }); }),
           py::arg("seed"))
      .def("deterministic", chained([](PythonBuilder& b, bool on) { b.option([&](auto& x) { x.deterministic(on); }); }),
           py::arg("on") = true, "The same output, in the same order, whatever the threads.")
      .def("epochs", chained([](PythonBuilder& b, std::uint32_t n) { b.option([&](auto& x) { x.epochs(n); }); }),
           py::arg("n"), "Epochs to run; 0 = until stopped, or until an epoch yields nothing.")
      .def("occupancy_log", chained([](PythonBuilder& b, const std::string& path, int interval_ms) {
             b.option([&](auto& x) { x.occupancy_log(path, std::chrono::milliseconds(interval_ms)); });
           }),
           py::arg("path"), py::arg("interval_ms") = 50, "A JSON Lines log of the queues, for stoker-inspect.")
      .def("log_label", chained([](PythonBuilder& b, const std::string& key, const std::string& value) {
             b.option([&](auto& x) { x.log_label(key, value); });
           }),
           py::arg("key"), py::arg("value"))
      .def("trace",
           chained([](PythonBuilder& b, const std::string& path) { b.option([&](auto& x) { x.trace(path); }); }),
           py::arg("path"), "A Chrome trace event file of the run (Perfetto's UI).")
      .def("timeline",
           chained([](PythonBuilder& b, const Timeline& t) { b.option([&](auto& x) { x.timeline(t.source); }); }),
           py::arg("timeline"))
      .def("counters",
           chained([](PythonBuilder& b, const Counters& c) { b.option([&](auto& x) { x.counters(c.source); }); }),
           py::arg("counters"))
      .def("autotune", chained([](PythonBuilder& b, int threads, int interval_ms) {
             b.option([&](auto& x) {
               x.autotune(AutotuneOptions{.threads = threads, .interval = std::chrono::milliseconds(interval_ms)});
             });
           }),
           py::arg("threads") = 0, py::arg("interval_ms") = 250,
           "Moves threads between the map and flat_map stages as the pipeline runs.")
      .def("resume_from", chained([](PythonBuilder& b, const std::string& state) {
             const PipelineState s = PipelineState::from_json(state, "resume_from's state");
             b.option([&](auto& x) { x.resume_from(s); });
             b.resumed_at(s.consumed);
           }),
           py::arg("state"), "Go on from where a run stood: a JSON string from Pipeline.state().")
      .def("first_epoch",
           chained([](PythonBuilder& b, std::uint32_t n) { b.option([&](auto& x) { x.first_epoch(n); }); }),
           py::arg("n"),
           "The epoch the run starts at, for a run that goes on by a count its caller keeps (ImageSource's "
           "resume_at): not with resume_from.")
      .def("source",
           chained([](PythonBuilder& b, const std::string& name, const py::object& fn, std::size_t queue,
                      std::size_t max_chunk, std::string_view on_error) {
             b.source({name, fn}, {.queue = queue, .max_chunk = max_chunk, .on_error = parse_on_error(on_error)});
           }),
           py::arg("name"), py::arg("fn"), py::arg("queue") = 64u, py::arg("max_chunk") = 0u,
           py::arg("on_error") = "fail",
           "A reader (IdxReader, NpyReader, RawVolumeReader, SyntheticSource), a ShuffledShard, an "
           "ImageSource, or a Python callable returning an item, or None at the end of each epoch.")
      .def("map",
           chained([](PythonBuilder& b, const std::string& name, const py::object& fn, int threads, std::size_t queue,
                      std::size_t max_chunk, std::string_view on_error, bool copy_per_body, bool autotune) {
             b.map({name, fn}, stage_options(threads, queue, max_chunk, on_error, copy_per_body, autotune));
           }),
           py::arg("name"), py::arg("fn"), py::arg("threads") = 1, py::arg("queue") = 64u, py::arg("max_chunk") = 0u,
           py::arg("on_error") = "fail", py::arg("copy_per_body") = false, py::arg("autotune") = true,
           "1 -> 1: fn(item) is the output.")
      .def("flat_map",
           chained([](PythonBuilder& b, const std::string& name, const py::object& fn, const py::object& output,
                      int threads, std::size_t queue, std::size_t max_chunk, std::string_view on_error,
                      bool copy_per_body, bool autotune, std::size_t fanout) {
             b.flat_map({name, fn}, output,
                        stage_options(threads, queue, max_chunk, on_error, copy_per_body, autotune, fanout));
           }),
           py::arg("name"), py::arg("fn"), py::arg("output") = py::none(), py::arg("threads") = 1,
           py::arg("queue") = 64u, py::arg("max_chunk") = 0u, py::arg("on_error") = "fail",
           py::arg("copy_per_body") = false, py::arg("autotune") = true, py::arg("fanout") = 0u,
           "1 -> k. output: the item class to emit (stoker.Sample, stoker.DeferredCrop, ...) where "
           "the function can emit several; a Python callable returns an iterable.")
      .def("shuffle",
           chained([](PythonBuilder& b, const std::string& name, std::size_t capacity, std::size_t min_after_dequeue,
                      std::optional<std::uint64_t> seed) {
             b.shuffle(name, {.capacity = capacity, .min_after_dequeue = min_after_dequeue, .seed = seed});
           }),
           py::arg("name"), py::arg("capacity") = 10'000u, py::arg("min_after_dequeue") = 2'000u,
           py::arg("seed") = py::none(), "Makes the queue after the last stage a random-shuffle buffer.")
      .def("batch",
           chained([](PythonBuilder& b, const std::string& name, std::size_t size, bool drop_remainder,
                      std::size_t queue) { b.batch(name, size, {.drop_remainder = drop_remainder, .queue = queue}); }),
           py::arg("name"), py::arg("size"), py::arg("drop_remainder") = false, py::arg("queue") = 8u,
           "Groups `size` items into a list.")
      .def(
          "build",
          [](PythonBuilder& b, const std::optional<std::string>& labels) {
            return b.build(labels ? std::optional(parse_choice<LabelType>(
                                        *labels, "labels", {{"int32", LabelType::i32}, {"int64", LabelType::i64}}))
                                  : std::nullopt);
          },
          py::arg("labels") = py::none(),
          "Starts the pipeline. labels: 'int64' (the default for host batches: what "
          "torch.nn.functional.cross_entropy takes) or 'int32' (the batches' own; device batches have "
          "only these).")
      .def("__repr__", &PythonBuilder::describe);

  pipeline.def("next", &PythonPipeline::next, "The next item of the epoch, or None at its end (and the run's).")
      .def(
          "epoch", [](py::object self) { return EpochIterator{std::move(self)}; }, "The rest of the current epoch.")
      .def(
          "epochs", [](py::object self) { return EpochsIterator{std::move(self)}; },
          "The epochs until the run is over, each the rest of the current epoch.")
      .def("__iter__", [](py::object self) { return EpochIterator{std::move(self)}; })
      .def("__len__", &PythonPipeline::epoch_length,
           "Items of the current epoch, whole: batches per epoch when it ends with a batch stage. A "
           "TypeError saying why where it is not known (a Python source without __len__, a flat_map without "
           "fanout).")
      .def("__repr__",
           [](const PythonPipeline& p) {
             return "stoker.Pipeline(epoch " + std::to_string(p.current_epoch()) +
                    (p.finished() ? ", finished)" : ", running)");
           })
      .def("stop", &PythonPipeline::stop, "Stops every stage and waits for their bodies. Idempotent.")
      .def_property_readonly("finished", &PythonPipeline::finished)
      .def_property_readonly("current_epoch", &PythonPipeline::current_epoch)
      .def("summary", &PythonPipeline::summary,
           "Counters of every stage (python: True for a Python stage) and queue, as a dict.")
      .def("summary_table", &PythonPipeline::summary_table, "The summary as stoker's fixed-width table.")
      .def("state", &PythonPipeline::state,
           "Where the run stands, as JSON: PipelineBuilder.resume_from(state) goes on from there.")
      .def("__enter__", [](PythonPipeline& self) -> PythonPipeline& { return self; })
      .def("__exit__", [](PythonPipeline& p, const py::args&) {
        p.stop();
        return false;
      });

  epoch.def("__iter__", [](EpochIterator& self) -> EpochIterator& { return self; })
      .def("__next__", &EpochIterator::next)
      .def("__len__", &EpochIterator::left, "Items the epoch has left.")
      .def("__repr__", [](const EpochIterator& e) {
        try {
          return "stoker.Epoch(" + std::to_string(e.left()) + " left)";
        } catch (const py::type_error&) {  // its length is not known
          return std::string("stoker.Epoch()");
        }
      });
  epochs.def("__iter__", [](EpochsIterator& self) -> EpochsIterator& { return self; })
      .def("__next__", &EpochsIterator::next)
      .def("__repr__", [](const EpochsIterator&) { return std::string("stoker.Epochs()"); });

  py::module_::import("atexit").attr("register")(py::cpp_function(&PythonPipeline::stop_all));
}

}  // namespace stoker::python
