// SPDX-License-Identifier: Apache-2.0
#include "train.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <sched.h>

#include "checkpoint.h"
#include "images.h"
#include "mlp.h"
#include "stoker/cluster/communicator.h"
#include "stoker/cluster/elastic.h"
#include "stoker/cluster/remote.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/gpu/augment.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/transforms.h"

namespace stoker::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Fashion-MNIST's pixel statistics, as in the reference job.
Normalization fashion_normalization() { return {255.0f, {0.2860f}, {0.3530f}}; }

IdxDataset load(const TrainOptions& o, std::string_view split) {
  IdxDataset d = fashion_mnist(o.data, split);
  if (o.limit != 0 && o.limit < d.size()) {
    d.labels.resize(o.limit);
    d.images.count = static_cast<std::uint32_t>(o.limit);
    d.images.pixels.resize(o.limit * d.images.height * d.images.width);
  }
  return d;
}

// The test set as one device array of center crops and their labels, uploaded once.
struct TestSet {
  gpu::Memory memory;
  std::size_t count = 0, labels_offset = 0;

  const float* images() const { return reinterpret_cast<const float*>(memory.data()); }
  const std::int32_t* labels() const { return reinterpret_cast<const std::int32_t*>(memory.data() + labels_offset); }
};

TestSet upload_test_set(std::vector<Sample> crops, gpu::Device& device, gpu::Stream& stream) {
  const auto pool = BufferPool::create();
  const Batch batch = make_batch(std::move(crops), *pool);  // samples then labels: one copy
  TestSet t{device.allocate(batch.payload_bytes()), batch.count, batch.labels_offset()};
  stream.copy_to_device(t.memory.data(), batch.data(), batch.payload_bytes());
  stream.synchronize();  // `batch` is freed on return
  return t;
}

TestSet upload_test_set(std::shared_ptr<const IdxDataset> data, const TrainOptions& o, gpu::Device& device,
                        gpu::Stream& stream) {
  const auto pool = BufferPool::create();
  const IdxReader reader(std::move(data), {.pool = pool});
  const CenterCrop center({.size = {o.crop_size, o.crop_size}, .normalize = fashion_normalization(), .pool = pool});
  std::vector<Sample> crops;
  crops.reserve(reader.dataset_size());
  for (std::uint64_t i = 0; i < reader.dataset_size(); ++i) crops.push_back(center(reader.read(i)));
  return upload_test_set(std::move(crops), device, stream);
}

// What both modes share: the device, the model, the learning-rate schedule and the per-epoch
// bookkeeping. One training step per device batch, issued to the compute stream.
class Trainer {
 public:
  // `ranks`: the ranks whose gradients are averaged every step; null for one process. `world`:
  // the job's ranks, told where this one stands (Communicator::set_status).
  Trainer(const TrainOptions& o, const TrainCallbacks& callbacks, std::shared_ptr<gpu::Device> device,
          std::uint64_t samples_per_epoch, cluster::Communicator* ranks, cluster::Communicator* world)
      : o_(o),
        callbacks_(callbacks),
        ranks_(ranks && ranks->size() > 1 ? ranks : nullptr),
        world_(world && world->size() > 1 ? world : nullptr),
        device_(std::move(device)),
        compute_(device_->make_stream()),
        model_(*device_, *compute_, model_options(o)),
        graph_(o.graph == "auto" && device_->backend() == gpu::Backend::cuda && !ranks_),
        samples_per_epoch_(samples_per_epoch),
        total_steps_(static_cast<std::uint64_t>(o.epochs) * ((samples_per_epoch + o.batch_size - 1) / o.batch_size)) {
    // The host waits on these: asleep (blocking sync), not spinning a core the pipeline needs.
    for (int i = 0; i < o.in_flight; ++i) step_done_.push_back(device_->make_event(gpu::HostWait::block));
    caught_up_ = device_->make_event(gpu::HostWait::block);
  }

  // Checkpoints.
  /// Writes o.checkpoint/checkpoint with every rank's pipeline state (gathered at rank 0, which
  /// writes it: the ranks' models are the same) and the plan of their epoch. Every rank calls it
  /// at the same step.
  void checkpoint(const PipelineState& pipeline) {
    // Each rank's digests, then its state.
    std::vector<std::string> records{std::to_string(run_digest()) + " " + std::to_string(current_.digest) + "\n" +
                                     pipeline.to_json()};
    if (ranks_) records = ranks_->gather(records.front());
    if (ranks_ && ranks_->rank() != 0) return;
    Checkpoint c{step_, current_.samples,       current_.batches,  Checkpoint::options_of(o_, data_),
                 {},    model_.save(*compute_), plan_for(pipeline), {}};
    if (digest_known_) c.digests.emplace();
    for (const auto& r : records) {
      const auto end = r.find('\n');
      std::istringstream digests(r.substr(0, end));
      std::uint64_t run = 0, epoch = 0;
      digests >> run >> epoch;
      if (c.digests) {
        c.digests->run += run;
        c.digests->epoch += epoch;
      }
      c.pipelines.push_back(PipelineState::from_json(r.substr(end + 1)));
    }
    c.save(o_.checkpoint);
  }
  /// Goes on from `c`, inside the epoch its pipeline states are in: on as many ranks, each from
  /// its own state; on another number, each with its share of what the states left of the epoch.
  void resume(const Checkpoint& c, const std::filesystem::path& from) {
    const auto shard = this->shard();
    const auto then = static_cast<std::uint32_t>(c.pipelines.size());
    const std::uint32_t epoch = c.pipelines.front().epoch;
    const cluster::EpochPlan plan_then = c.plan ? *c.plan : fresh_plan(epoch, then);
    model_.restore(*compute_, c.model);
    step_ = c.step;
    current_ = EpochReport{};
    current_.epoch = epoch + 1;
    // Per rank: the samples of the epoch trained before, the job's shared among this one's ranks.
    current_.samples = current_.resumed_samples = c.samples * then / shard.world;
    current_.batches = current_.resumed_batches = c.batches;
    started_ = Clock::now();
    // The checkpoint's digests go to rank 0 alone, so that the ranks' sum is the run's.
    digest_known_ = c.digests.has_value();
    if (c.digests && shard.rank == 0) {
      resumed_digest_ = c.digests->run;
      current_.digest = c.digests->epoch;  // taken back below if this run starts in a later epoch
    }
    if (then == shard.world) {
      resume_ = c.pipelines[shard.rank];
      if (!plan_then.is_fresh()) plan_ = plan_then;
      return;
    }
    const auto& states = c.pipelines;
    if (states.front().deterministic) {
      // Which batches each rank had taken follows from its count alone only at its own world
      // size; at an epoch's edge there is nothing to share out.
      const std::uint64_t steps =
          (plan_then.units() / then + o_.batch_size * shard.world / then - 1) / (o_.batch_size * shard.world / then);
      const bool edge = plan_then.is_fresh() && std::all_of(states.begin(), states.end(), [&](const auto& s) {
                          return s.epoch == epoch && (s.consumed == 0 || s.consumed == steps);
                        });
      if (!edge)
        throw std::invalid_argument(
            "--resume " + from.string() + ": the checkpoint is of a deterministic job of " + std::to_string(then) +
            " ranks, taken mid-epoch, and this job has " + std::to_string(shard.world) +
            ": a deterministic state does not list which samples its rank took, so it goes on mid-epoch only on as "
            "many ranks (resume a checkpoint taken without --deterministic, or at an epoch's end, on another number)");
      blank_epoch_ = states.front().consumed == 0 ? epoch : epoch + 1;
      current_.epoch = *blank_epoch_ + 1;
      current_.samples = current_.resumed_samples = 0;
      current_.batches = current_.resumed_batches = 0;
      current_.digest = 0;
      return;
    }
    plan_ = cluster::EpochPlan::of_rest(epoch, data_size_, units_per_sample(), plan_then.rest(states), shard.world,
                                        o_.batch_size);
    blank_epoch_ = epoch;
  }
  /// Where the pipeline goes on from, after resume(), given `blank`: the state of a pipeline of
  /// the same stages, not resumed (needed when blank_needed()).
  std::optional<PipelineState> resume_point(const std::optional<PipelineState>& blank) const {
    if (!blank_epoch_) return resume_;
    PipelineState s = blank.value();
    if (plan_ && plan_->epoch() == *blank_epoch_) return plan_->resume_state(shard().rank, std::move(s));
    s.epoch = *blank_epoch_;  // the start of an epoch
    return s;
  }
  bool resumed() const { return resume_ || blank_epoch_; }
  bool blank_needed() const { return blank_epoch_.has_value(); }
  /// This rank's share of the epoch a resumed run starts in, when it is a share of a rest (for
  /// cluster::ElasticShard); nullopt when ShuffledShard's.
  std::optional<std::pair<std::uint32_t, cluster::Share>> first_share() const {
    if (!plan_) return std::nullopt;
    return std::pair{plan_->epoch(), plan_->share(shard().rank)};
  }
  /// The size of the training set, which the plans of its epochs share out, and what it is
  /// (Checkpoint::options_of).
  void set_data(std::uint64_t samples, std::string what) {
    data_size_ = samples;
    data_ = std::move(what);
  }
  /// With remote workers: the plan a checkpoint keeps, given the trainer's pipeline state (what
  /// the edge says is left of its epoch); none: the ranks' plans.
  void set_remote_plan(std::function<cluster::EpochPlan(const PipelineState&)> plan) { remote_plan_ = std::move(plan); }
  /// This rank's share of the data.
  ShardOptions shard() const {
    if (!ranks_) return {};
    return {.rank = static_cast<std::uint32_t>(ranks_->rank()), .world = static_cast<std::uint32_t>(ranks_->size())};
  }
  /// A hash of the model's parameters: the same on every rank, or the ranks have diverged.
  std::uint64_t weights_hash() {
    const auto bytes = model_.save(*compute_);
    const std::size_t n = model_.parameter_count() * sizeof(float);  // the parameters come first
    return hash_name({reinterpret_cast<const char*>(bytes.data()), n});
  }
  std::uint64_t steps() const { return step_; }
  /// This rank's share of TrainReport::digest so far: at rank 0 of a resumed run, with the
  /// checkpoint's. trained_digest(): of what this process trained.
  std::uint64_t run_digest() const { return resumed_digest_ + trained_digest_; }
  std::uint64_t trained_digest() const { return trained_digest_; }
  /// False after --resume of a checkpoint that has no digests (before version 3).
  bool digest_known() const { return digest_known_; }
  /// Whether its gradients are averaged with other ranks' every step.
  bool data_parallel() const { return ranks_ != nullptr; }
  /// Time spent in the gradient exchange so far: waiting for the other ranks, and the transfer.
  /// Any thread (the occupancy log reads it as a counter).
  std::uint64_t exchange_wait_ns() const { return exchange_wait_ns_.load(std::memory_order_relaxed); }
  /// TrainCallbacks::stop_requested, which stays true once it has said so.
  bool stop_requested() {
    if (!stopped_ && callbacks_.stop_requested) stopped_ = callbacks_.stop_requested();
    return stopped_;
  }
  bool stopped() const { return stopped_; }
  /// The epoch under way, as far as it went.
  const EpochReport& current() const { return current_; }
  /// Tells the other ranks what this one is doing for its next step ("epoch 2, step 341:
  /// waiting for its pipeline's batch"), for their timeout messages.
  void say(const char* doing) {
    if (!world_) return;
    char text[160];
    std::snprintf(text, sizeof text, "epoch %u, step %llu: %s", current_.epoch,
                  static_cast<unsigned long long>(step_ + 1), doing);
    world_->set_status(text);
  }

  gpu::Device& device() { return *device_; }
  const std::shared_ptr<gpu::Device>& device_ptr() { return device_; }
  gpu::Stream& compute() { return *compute_; }
  Mlp& model() { return model_; }

  /// The resumed epoch's time starts with its first step here, not with the setup before it.
  void start_clock() { started_ = Clock::now(); }

  /// The model's accuracy on the test set, as it stands.
  double evaluate(const TestSet& test) {
    model_.reset_counters(*compute_);
    model_.evaluate(*compute_, test.images(), test.labels(), test.count);
    const MlpCounters c = model_.read_counters(*compute_);
    return static_cast<double>(c.test_correct) / static_cast<double>(std::max<std::size_t>(test.count, 1));
  }

  void begin_epoch(std::uint32_t epoch) {
    current_ = EpochReport{};
    current_.epoch = epoch;
    model_.reset_counters(*compute_);
    started_ = Clock::now();
  }

  // The host waits for the device only to keep at most `in_flight` steps queued: that bounds
  // the work in flight, and it makes the time spent waiting for input mean what it says
  // (without it, a trainer that outruns the device would seem starved, its next batch held
  // up by device buffers that the queued steps still use).
  void step(gpu::DeviceBatch& batch) {
    gpu::Event& done = *step_done_[issued_ % step_done_.size()];
    if (issued_ >= step_done_.size()) {
      const auto t0 = Clock::now();
      done.synchronize();
      current_.device_wait_seconds += seconds_since(t0);
    }
    batch.use_on(*compute_);
    // One span a step in a trace, not one per kernel: the step's two dozen small kernels would
    // cost the trace a pair of timing events each.
    gpu::timed_work(*compute_, "train_step", [&] {
      // After a first step kernel by kernel, which makes what the kernels make on first use (the
      // stream's cuBLAS handle), which a graph capture could not.
      if (graph_ && batch.count == o_.batch_size && issued_ > 0)
        graph_step(batch);
      else
        model_.train_step(*compute_, batch.data_as<float>(), batch.labels(), static_cast<int>(batch.count),
                          learning_rate(), ranks_ ? average_gradients_ : Mlp::Reduce{});
    });
    if (batch.host_ids.size() != batch.count)
      throw std::logic_error("stoker-train: a batch of " + std::to_string(batch.count) + " crops came with " +
                             std::to_string(batch.host_ids.size()) + " ids");
    std::uint64_t digest = 0;
    for (std::uint64_t id : batch.host_ids) digest += sample_digest(current_.epoch, id);
    current_.digest += digest;
    trained_digest_ += digest;
    batch.release_after(*compute_);
    compute_->record(done);
    ++issued_;
    ++step_;
    ++current_.batches;
    current_.samples += batch.count;
    if (callbacks_.on_batch) callbacks_.on_batch(current_.epoch, current_.samples, samples_per_epoch_);
  }

  void add_input_wait(double seconds) { current_.input_wait_seconds += seconds; }
  /// How many steps ran as one CUDA graph launch (TrainOptions::graph).
  std::uint64_t graph_steps() const noexcept { return graph_steps_; }

  /// Waits, asleep, for the work issued to `stream` so far (Stream::synchronize may spin).
  void wait_for(gpu::Stream& stream) {
    stream.record(*caught_up_);
    caught_up_->synchronize();
  }

  // Waits for the epoch's last step, evaluates and reads all the counters back in one copy.
  EpochReport end_epoch(const TestSet& test) {
    wait_for(*compute_);
    current_.train_seconds = seconds_since(started_);
    const auto t0 = Clock::now();
    model_.evaluate(*compute_, test.images(), test.labels(), test.count);
    const MlpCounters c = model_.read_counters(*compute_);
    current_.eval_seconds = seconds_since(t0);
    // Loss and accuracy over every rank's samples (their sums are exact in floats up to 2^24).
    std::vector<float> sums{static_cast<float>(c.train_loss_sum), static_cast<float>(c.train_correct),
                            static_cast<float>(current_.samples)};
    if (ranks_) ranks_->allreduce_sum(sums);
    const auto samples = static_cast<double>(std::max(sums[2], 1.0f));
    current_.loss = sums[0] / samples;
    current_.train_accuracy = sums[1] / samples;
    current_.test_accuracy =
        static_cast<double>(c.test_correct) / static_cast<double>(std::max<std::size_t>(test.count, 1));
    if (callbacks_.on_epoch) callbacks_.on_epoch(current_);
    return current_;
  }

 private:
  static MlpOptions model_options(const TrainOptions& o) {
    MlpOptions m;
    m.layers = {static_cast<int>(o.crop_size * o.crop_size)};
    m.layers.insert(m.layers.end(), o.hidden.begin(), o.hidden.end());
    m.layers.push_back(10);
    m.max_rows = static_cast<int>(o.batch_size);
    m.momentum = o.momentum;
    m.weight_decay = o.weight_decay;
    m.seed = o.seed;
    return m;
  }

  // A full step as one launch: the batch copied to where the step captured from the first one
  // reads it, the rate set, the graph launched. The host issues 4 calls a step, not two dozen.
  void graph_step(const gpu::DeviceBatch& batch) {
    const std::size_t x_bytes = batch.count * static_cast<std::size_t>(model_.options().layers.front()) * sizeof(float);
    if (!captured_step_) {
      step_input_ = device_->allocate(x_bytes + batch.count * sizeof(std::int32_t));
      captured_step_ = model_.capture_step(*compute_, reinterpret_cast<const float*>(step_input_.data()),
                                           reinterpret_cast<const std::int32_t*>(step_input_.data() + x_bytes),
                                           static_cast<int>(batch.count));
    }
    compute_->copy_on_device(step_input_.data(), batch.data_as<float>(), x_bytes);
    compute_->copy_on_device(step_input_.data() + x_bytes, batch.labels(), batch.count * sizeof(std::int32_t));
    model_.set_learning_rate(*compute_, learning_rate());
    captured_step_->run();
    ++graph_steps_;
  }

  std::uint64_t units_per_sample() const { return static_cast<std::uint64_t>(o_.crops); }
  cluster::EpochPlan fresh_plan(std::uint32_t epoch, std::uint32_t world) const {
    return cluster::EpochPlan::fresh(epoch, data_size_, units_per_sample(), world);
  }
  // The plan of the epoch `state` is in: with remote workers, what the edge says is left of it;
  // a resumed epoch's shares of its rest; ShuffledShard's.
  cluster::EpochPlan plan_for(const PipelineState& state) const {
    if (remote_plan_) return remote_plan_(state);
    if (plan_ && plan_->epoch() == state.epoch) return *plan_;
    return fresh_plan(state.epoch, shard().world);
  }

  // Cosine decay from the initial rate to zero over the whole run.
  float learning_rate() const {
    const double progress = static_cast<double>(step_) / static_cast<double>(std::max<std::uint64_t>(total_steps_, 1));
    return static_cast<float>(o_.learning_rate * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
  }

  // The mean of every rank's gradients, in place: through host memory, which MPI reads.
  void average(gpu::Stream& stream, float* gradients, std::size_t n) {
    host_gradients_.resize(n);
    stream.copy_to_host(host_gradients_.data(), gradients, n * sizeof(float));
    wait_for(stream);
    const auto t0 = Clock::now();
    ranks_->allreduce_mean(host_gradients_);
    // The slowest rank waits here least: the evidence of which rank the others wait for.
    const double waited = seconds_since(t0);
    current_.exchange_wait_seconds += waited;
    exchange_wait_ns_.fetch_add(static_cast<std::uint64_t>(waited * 1e9), std::memory_order_relaxed);
    stream.copy_to_device(gradients, host_gradients_.data(), n * sizeof(float));  // before the next step's read-back
  }

  const TrainOptions& o_;
  const TrainCallbacks& callbacks_;
  cluster::Communicator* ranks_;
  cluster::Communicator* world_;
  std::vector<float> host_gradients_;
  const Mlp::Reduce average_gradients_ = [this](gpu::Stream& s, float* g, std::size_t n) { average(s, g, n); };
  std::shared_ptr<gpu::Device> device_;
  std::unique_ptr<gpu::Stream> compute_;
  Mlp model_;
  std::vector<std::unique_ptr<gpu::Event>> step_done_;
  std::unique_ptr<gpu::Event> caught_up_;  // wait_for()'s
  const bool graph_;
  gpu::Memory step_input_;                      // where the captured step reads its batch
  std::unique_ptr<gpu::Replay> captured_step_;  // made at the first full batch
  std::uint64_t samples_per_epoch_, total_steps_;
  std::uint64_t step_ = 0;    // of the run: the learning rate's schedule
  std::uint64_t issued_ = 0;  // by this process: which event a step records
  std::uint64_t graph_steps_ = 0;
  std::optional<PipelineState> resume_;       // this rank's own, when resumed on as many ranks
  std::optional<std::uint32_t> blank_epoch_;  // resumed on another number: the epoch it starts in
  std::optional<cluster::EpochPlan> plan_;    // a resumed epoch's shares of its rest
  std::uint64_t data_size_ = 0;
  std::string data_;
  std::uint64_t resumed_digest_ = 0, trained_digest_ = 0;  // run_digest()'s parts
  bool digest_known_ = true;
  std::function<cluster::EpochPlan(const PipelineState&)> remote_plan_;
  EpochReport current_;
  Clock::time_point started_;
  bool stopped_ = false;
  std::atomic<std::uint64_t> exchange_wait_ns_{0};
};

// The crops are drawn by the crop stage and cut by the collate, normalized on the way,
// straight into the batch: each crop is written once.
RandomCrops random_crops(const TrainOptions& o) {
  return RandomCrops({.size = {o.crop_size, o.crop_size},
                      .count = o.crops,
                      .mirror = MirrorOptions{.axis = Axis::width, .p = o.mirror_p}});
}

}  // namespace

gpu::OutputSizing output_sizing(const TrainOptions& o, std::size_t per_call) {
  return {.per_call = per_call, .queued = o.batch_queue, .held = static_cast<std::size_t>(o.in_flight) + 1};
}

namespace {

gpu::ToDeviceOptions to_device_options(const TrainOptions& o) {
  const Shape crop{1, 1, o.crop_size, o.crop_size, false};
  return {.bytes = Batch::storage_bytes(crop, DType::f32, o.batch_size),
          .staging_buffers = o.staging_buffers,
          .device_buffers = output_sizing(o, 1).buffers()};
}

// Where a process stands in its job: its rank, the job's ranks, and with remote workers its role
// ("trainer" or "worker").
struct Place {
  int rank = 0, world = 1;
  std::string role;
};

// A job's ranks write a file each, the rank in its name (run.rank1.jsonl), and label their logs
// with it (and their role), for stoker-inspect to read them together.
std::string per_rank(const std::string& file, const Place& place) {
  if (place.world == 1) return file;
  std::filesystem::path path(file);
  return path.replace_filename(path.stem().string() + ".rank" + std::to_string(place.rank) + path.extension().string())
      .string();
}

void log_place(PipelineBuilder& builder, const TrainOptions& o, const Place& place) {
  if (!o.occupancy_log.empty()) builder.occupancy_log(per_rank(o.occupancy_log, place));
  if (place.world > 1) builder.log_label("rank", std::to_string(place.rank));
  if (!place.role.empty()) builder.log_label("role", place.role);
  if (!o.images.empty()) builder.log_label("data", "images");  // stoker-inspect's suggestions fit --images
}

PipelineBuilder pipeline_builder(const TrainOptions& o, Trainer& trainer, const std::optional<PipelineState>& resume,
                                 Place place = {}) {
  PipelineBuilder builder;
  CounterSource counters = gpu::transfer_counters(trainer.device_ptr());
  if (trainer.data_parallel())  // the log's exchange_wait_ns: how long this rank waited for the others
    counters = [copies = std::move(counters), &trainer] {
      auto all = copies();
      all.push_back({"exchange_wait_ns", trainer.exchange_wait_ns()});
      return all;
    };
  builder.threads(o.threads).budget(o.budget).seed(o.seed).epochs(o.epochs).counters(std::move(counters));
  if (trainer.data_parallel()) {
    const auto shard = trainer.shard();
    place = {static_cast<int>(shard.rank), static_cast<int>(shard.world), ""};
  }
  log_place(builder, o, place);
  // The device's copies and kernels (the trainer's too) on its streams' tracks: a trace per
  // training rank (with remote workers, the trainer's alone).
  if (!o.trace.empty())
    builder.trace(trainer.data_parallel() ? per_rank(o.trace, place) : o.trace)
        .timeline(gpu::device_timeline(trainer.device_ptr()));
  if (o.autotune) builder.autotune();  // the pipeline's threads are the budget
  if (o.deterministic) builder.deterministic();
  if (resume) builder.resume_from(*resume);
  return builder;
}

ShuffleOptions shuffle_options(const TrainOptions& o) {
  return {.capacity = o.shuffle_capacity, .min_after_dequeue = o.min_after_dequeue, .seed = o.seed};
}

// The training loop of pipelined mode: one step per device batch the pipeline delivers.
void train_from(Pipeline<gpu::DeviceBatch>& pipe, const TrainOptions& o, Trainer& trainer, const TestSet& test,
                TrainReport& report) {
  const std::uint32_t first = pipe.current_epoch() + 1;
  // Checked after the pipeline took the checkpoint's state, which it refuses if it is of
  // another seed or data set.
  if (first > o.epochs) {
    report.nothing_to_train = true;
    report.checkpoint_test_accuracy = trainer.evaluate(test);
    return;
  }
  for (std::uint32_t epoch = first; epoch <= o.epochs; ++epoch) {
    if (epoch != first || !trainer.resumed())
      trainer.begin_epoch(epoch);
    else
      trainer.start_clock();
    bool stopped = false;
    for (;;) {
      // Between two steps, where pipe.state() matches the model: a checkpoint made below then
      // resumes exactly.
      if (trainer.stop_requested()) {
        stopped = true;
        break;
      }
      trainer.say("waiting for its pipeline's batch");
      const auto t0 = Clock::now();
      std::optional<gpu::DeviceBatch> batch = pipe.next();
      trainer.add_input_wait(seconds_since(t0));
      if (!batch) break;
      trainer.say("training");
      trainer.step(*batch);
      if (o.checkpoint_every != 0 && trainer.steps() % o.checkpoint_every == 0) {
        trainer.say("writing a checkpoint before it");
        trainer.checkpoint(pipe.state());
      }
    }
    if (stopped) break;
    trainer.say("evaluating the epoch before it");
    report.epochs.push_back(trainer.end_epoch(test));
  }
  if (!o.checkpoint.empty()) trainer.checkpoint(pipe.state());
  report.pipeline = pipe.summary();
}

// images -> crops (threads) -> shuffle -> batch -> collate into pinned memory -> copy.
Pipeline<gpu::DeviceBatch> crops_to_device(Builder<Sample> images, const TrainOptions& o,
                                           const gpu::ToDevice& to_device) {
  return std::move(images)
      .flat_map<DeferredCrop>("crops", random_crops(o),
                              {.threads = o.crop_threads, .fanout = static_cast<std::size_t>(o.crops)})
      .shuffle("shuffle", shuffle_options(o))
      .batch("batch", o.batch_size, {.queue = o.batch_queue})
      .map("collate", Collate{.pool = to_device.staging(), .normalize = Normalizer(fashion_normalization())},
           {.threads = o.collate_threads, .queue = o.batch_queue})
      .map("h2d", to_device, {.queue = o.batch_queue, .autotune = false})
      .build();
}

// reader -> crops (threads) -> shuffle -> batch -> collate into pinned memory -> copy -> trainer.
void train_pipelined(const TrainOptions& o, std::shared_ptr<const IdxDataset> data, Trainer& trainer,
                     const TestSet& test, TrainReport& report) {
  const gpu::ToDevice to_device(trainer.device_ptr(), to_device_options(o));
  const auto reader = std::make_shared<IdxReader>(std::move(data), ReaderOptions{.pool = BufferPool::create()});
  const auto source = [&] { return cluster::ElasticShard(reader, trainer.shard(), trainer.first_share()); };
  const StageOptions crops{.threads = o.crop_threads, .fanout = static_cast<std::size_t>(o.crops)};
  std::optional<PipelineState> blank;
  if (trainer.blank_needed()) {
    // Resumed on another number of ranks: the state to resume from is made from the state of a
    // pipeline of the same stages, not resumed, before its first item. Its last two stages have
    // the names and kinds of the real ones, and no pinned or device memory to hold.
    PipelineBuilder probe;
    probe.seed(o.seed).epochs(o.epochs).deterministic(o.deterministic).threads(1);
    blank = std::move(probe)
                .source("read", source(), {.queue = 1})
                .flat_map<DeferredCrop>("crops", random_crops(o), crops)
                .shuffle("shuffle", shuffle_options(o))
                .batch("batch", o.batch_size, {.queue = 1})
                .map("collate", [](std::vector<DeferredCrop> b) { return b; })
                .map("h2d", [](std::vector<DeferredCrop> b) { return b; })
                .build()
                .state();
  }
  auto pipe = crops_to_device(
      pipeline_builder(o, trainer, trainer.resume_point(blank)).source("read", source(), {.queue = o.read_queue}), o,
      to_device);
  train_from(pipe, o, trainer, test, report);
}

// --images: files read -> decoded to gray (threads) -> the same crops and all that follows. Bad
// files stop the run, or with --on-bad-input skip are left out and counted.
void train_pipelined_images(const TrainOptions& o, std::shared_ptr<const ImageDataset> data, Trainer& trainer,
                            const TestSet& test, TrainReport& report) {
  const gpu::ToDevice to_device(trainer.device_ptr(), to_device_options(o));
  const OnError on_bad = o.on_bad_input == "skip" ? OnError::skip : OnError::fail;
  if (trainer.blank_needed())
    throw std::invalid_argument("--resume with --images: the checkpoint goes on on as many ranks as wrote it");
  auto pipe = crops_to_device(pipeline_builder(o, trainer, trainer.resume_point(std::nullopt))
                                  .source("read", ImageSource(std::move(data), {.shard = trainer.shard()}),
                                          {.queue = o.read_queue, .on_error = on_bad})
                                  .map("decode", DecodeForTraining{.crop_size = o.crop_size},
                                       {.threads = o.crop_threads, .queue = o.read_queue, .on_error = on_bad}),
                              o, to_device);
  train_from(pipe, o, trainer, test, report);
  if (report.pipeline)  // none when a resumed run had nothing left to train
    for (const StageStats& s : report.pipeline->stages) report.skipped_images += s.skipped;
}

// --remote-workers: a batch on the wire is its storage (samples, labels, ids) after its count.
struct PackBatch {
  cluster::Bytes operator()(const Batch& b) const {
    const std::size_t n = Batch::storage_bytes(b.shape, b.dtype, b.count);
    cluster::Bytes bytes(sizeof(std::uint64_t) + n);
    const std::uint64_t count = b.count;
    std::memcpy(bytes.data(), &count, sizeof count);
    std::memcpy(bytes.data() + sizeof count, b.data(), n);
    return bytes;
  }
};
// ... and back, into the trainer's pinned staging buffers.
struct UnpackBatch {
  std::shared_ptr<BufferPool> pool;
  Shape shape;
  Batch operator()(cluster::Bytes bytes, const StageContext& ctx) const {
    std::uint64_t count = 0;
    if (bytes.size() >= sizeof count) std::memcpy(&count, bytes.data(), sizeof count);
    const std::size_t n = Batch::storage_bytes(shape, DType::f32, count);
    if (count == 0 || bytes.size() != sizeof count + n)
      throw std::runtime_error("a batch of " + std::to_string(bytes.size()) + " bytes from a worker is not " +
                               std::to_string(count) + " crops of " + shape.str());
    Batch b = Batch::allocate(*pool, shape, DType::f32, count, ctx);
    std::memcpy(b.data(), bytes.data() + sizeof count, n);
    return b;
  }
  std::size_t max_chunk() const { return pool->waits() ? 1 : std::numeric_limits<std::size_t>::max(); }
};

// A worker: reader (shards from rank 0) -> crops -> shuffle -> batch -> collate -> pack ==> rank 0.
void make_remote_batches(const TrainOptions& o, std::shared_ptr<const IdxDataset> data,
                         cluster::RemoteEdge<cluster::Bytes>& edge, const Place& place) {
  // Free order (the edge reads which crops each batch carries off the pipeline's states), and
  // the crop stage's fanout given: a worker that takes another's work over makes of an image
  // only the crops that did not arrive.
  edge.serve(std::make_shared<IdxReader>(std::move(data), ReaderOptions{.pool = BufferPool::create()}),
             [&](cluster::RemoteShards shards, std::optional<PipelineState> resume) {
               PipelineBuilder builder;
               log_place(builder, o, place);
               builder.threads(o.threads).budget(o.budget).seed(o.seed).epochs(o.epochs);
               if (resume) builder.resume_from(std::move(*resume));
               return std::move(builder)
                   .source("read", std::move(shards), {.queue = o.read_queue})
                   .flat_map<DeferredCrop>("crops", random_crops(o),
                                           {.threads = o.crop_threads, .fanout = static_cast<std::size_t>(o.crops)})
                   .shuffle("shuffle", shuffle_options(o))
                   .batch("batch", o.batch_size, {.queue = o.batch_queue})
                   .map("collate", Collate{.normalize = Normalizer(fashion_normalization())},
                        {.threads = o.collate_threads, .queue = o.batch_queue})
                   .map("pack", PackBatch{}, {.queue = o.batch_queue})
                   .build();
             });
}

// Rank 0 with remote workers: ==> batches -> unpack into pinned staging -> copy -> trainer.
// A checkpoint keeps the trainer's pipeline state and the crops of its epoch not yet trained
// (the edge's progress); a resumed trainer's pipeline starts that epoch afresh, and the workers
// make what is left.
void train_remote(const TrainOptions& o, cluster::RemoteEdge<cluster::Bytes>& edge, Trainer& trainer,
                  const TestSet& test, TrainReport& report, const Place& place) {
  const gpu::ToDevice to_device(trainer.device_ptr(), to_device_options(o));
  trainer.set_remote_plan([&edge](const PipelineState& state) {
    const auto p = edge.progress(state);
    return cluster::EpochPlan::of_rest(p.epoch, p.samples, p.fanout, p.left, 1, 1);
  });
  std::optional<PipelineState> resume = trainer.resume_point(std::nullopt);
  if (resume) {
    resume->consumed = 0;
    resume->taken = PipelineState::Taken{resume->taken.value().queue, 0, {}};
  }
  auto pipe = pipeline_builder(o, trainer, resume, place)
                  .source("batches", edge.receiver(), {.queue = o.batch_queue})
                  .map("unpack", UnpackBatch{to_device.staging(), Shape{1, 1, o.crop_size, o.crop_size, false}},
                       {.threads = o.collate_threads, .queue = o.batch_queue})
                  .map("h2d", to_device, {.queue = o.batch_queue, .autotune = false})
                  .build();
  train_from(pipe, o, trainer, test, report);
  trainer.set_remote_plan({});
  const auto stats = edge.stats();
  report.remote_workers = static_cast<std::uint32_t>(edge.options().workers.size());
  report.remote_bytes = stats.bytes;
  report.remote_peak = stats.peak_in_flight;
  for (std::size_t i = 0; i < stats.worker_samples.size() && i < edge.options().workers.size(); ++i)
    report.workers.push_back({edge.options().workers[i], stats.worker_samples[i]});
  report.remote_lost = stats.lost;
}

// --augment gpu: whole images go to the device, which crops, shuffles and batches them.
gpu::GpuAugmentOptions gpu_augment_options(const TrainOptions& o, const Shape& image) {
  gpu::GpuAugmentOptions a{.crops = {.size = {o.crop_size, o.crop_size},
                                     .count = o.crops,
                                     .mirror = MirrorOptions{.axis = Axis::width, .p = o.mirror_p},
                                     .normalize = fashion_normalization()},
                           .batch_size = o.batch_size,
                           // Another seed than the shuffle of images: the two draw independently.
                           .shuffle = {.capacity = o.shuffle_capacity,
                                       .min_after_dequeue = o.min_after_dequeue,
                                       .seed = derive_seed(o.seed, 0x77696e646f77)},
                           .image = image,
                           .max_images = o.image_batch,
                           .staging_buffers = o.staging_buffers};
  a.output_buffers = output_sizing(o, gpu::GpuAugment::buffers_per_call(a)).buffers();
  return a;
}

// The whole data set on the device, or images streamed to it: what --resident asks for.
gpu::GpuAugment make_gpu_augment(const TrainOptions& o, std::shared_ptr<const IdxDataset> data, gpu::Device& device,
                                 const std::shared_ptr<gpu::Device>& shared) {
  const std::size_t bytes = data->images.pixels.size();
  const bool resident = o.resident == "yes" || (o.resident == "auto" && device.backend() == gpu::Backend::cuda &&
                                                bytes <= device.free_memory() / 4);
  auto options = gpu_augment_options(o, data->shape());
  return resident ? gpu::GpuAugment::resident(shared, std::move(data), std::move(options))
                  : gpu::GpuAugment(shared, std::move(options));
}

// Streaming: reader -> shuffle of images -> batch -> collate into pinned memory -> one copy,
// crops, window, minibatches on the device -> trainer. Resident: the same with indices and
// no collate or copy.
void train_pipelined_gpu(const TrainOptions& o, std::shared_ptr<const IdxDataset> data, Trainer& trainer,
                         const TestSet& test, TrainReport& report) {
  gpu::GpuAugment augment = make_gpu_augment(o, data, trainer.device(), trainer.device_ptr());
  report.resident = augment.is_resident();
  const StageOptions augment_stage{.threads = 1, .queue = o.batch_queue, .autotune = false};
  if (augment.is_resident()) {
    auto pipe = pipeline_builder(o, trainer, trainer.resume_point(std::nullopt))
                    .source("ids", IdSource(IdxReader(data)), {.queue = o.read_queue})
                    .shuffle("shuffle", shuffle_options(o))
                    .batch("batch", o.image_batch, {.queue = o.batch_queue})
                    .flat_map<gpu::DeviceBatch>("gpu_augment", augment, augment_stage)
                    .build();
    return train_from(pipe, o, trainer, test, report);
  }
  auto pipe =
      pipeline_builder(o, trainer, trainer.resume_point(std::nullopt))
          .source("read", IdxReader(std::move(data), {.pool = BufferPool::create()}), {.queue = o.read_queue})
          .shuffle("shuffle", shuffle_options(o))
          .batch("batch", o.image_batch, {.queue = o.batch_queue})
          .map("collate", Collate{.pool = augment.staging()}, {.threads = o.collate_threads, .queue = o.batch_queue})
          .flat_map<gpu::DeviceBatch>("gpu_augment", augment, augment_stage)
          .build();
  train_from(pipe, o, trainer, test, report);
}

// The feed-dict baseline: the same reading, crops, shuffle, collate, copy and step, one after
// the other on this thread, with no overlap at all: the trainer waits for the device after
// every step, and the device waits while the next batch is made.
void train_sync(const TrainOptions& o, std::shared_ptr<const IdxDataset> data, Trainer& trainer, const TestSet& test,
                TrainReport& report) {
  const gpu::ToDevice to_device(trainer.device_ptr(), to_device_options(o));
  const IdxReader reader(std::move(data), {.pool = BufferPool::create()});
  const RandomCrops crops = random_crops(o);
  const Collate collate{.pool = to_device.staging(), .normalize = Normalizer(fashion_normalization())};
  RandomShuffleQueue<DeferredCrop> shuffle(
      "shuffle", {.capacity = o.shuffle_capacity, .min_after_dequeue = o.min_after_dequeue, .seed = o.seed});
  std::vector<DeferredCrop> samples, drawn;
  Emitter<DeferredCrop> emit(drawn);

  for (std::uint32_t epoch = 1; epoch <= o.epochs; ++epoch) {
    trainer.begin_epoch(epoch);
    const StageContext ctx{.seed = o.seed, .epoch = epoch - 1};
    // Takes a batch out of the shuffle buffer, if it has one, and trains on it.
    auto train_one = [&](Clock::time_point input_started, bool allow_partial) {
      samples.clear();
      if (shuffle.try_pop_many(samples, o.batch_size, allow_partial) == 0) return false;
      gpu::DeviceBatch batch = to_device(collate(std::move(samples)));
      trainer.add_input_wait(seconds_since(input_started));
      trainer.step(batch);
      trainer.wait_for(trainer.compute());
      return true;
    };
    for (std::uint64_t id = 0; id < reader.dataset_size(); ++id) {
      if (trainer.stop_requested()) return;
      auto t0 = Clock::now();
      drawn.clear();
      crops(reader.read(id), emit, ctx);
      for (DeferredCrop& crop : drawn)
        while (!shuffle.try_push(std::move(crop))) {  // full: make room first
          if (!train_one(t0, false))
            throw std::logic_error("sync mode: the shuffle buffer is full yet cannot be popped");
          t0 = Clock::now();
        }
      while (train_one(t0, false)) t0 = Clock::now();
      trainer.add_input_wait(seconds_since(t0));
    }
    shuffle.close();  // the remainder, in random order, the last batch short
    for (auto t0 = Clock::now(); train_one(t0, true);) t0 = Clock::now();
    shuffle.reopen(derive_seed(o.seed, epoch, 0x73796e63));
    report.epochs.push_back(trainer.end_epoch(test));
  }
}

// Sync mode with --augment gpu: the same shuffle of images (or of indices), input batches and
// device crops, one step after another: each input batch is cropped, then its minibatches are
// trained on, the host waiting for the device after every step.
template <class Item, class Read>
void train_sync_gpu_items(const TrainOptions& o, std::uint64_t n, Read read, gpu::GpuAugment& augment, Trainer& trainer,
                          const TestSet& test, TrainReport& report) {
  RandomShuffleQueue<Item> shuffle("shuffle", shuffle_options(o));
  std::vector<Item> items;
  std::vector<gpu::DeviceBatch> minibatches;
  Emitter<gpu::DeviceBatch> emit(minibatches);
  for (std::uint32_t epoch = 1; epoch <= o.epochs; ++epoch) {
    trainer.begin_epoch(epoch);
    const StageContext ctx{.seed = o.seed, .epoch = epoch - 1};
    auto t0 = Clock::now();
    const auto train_all = [&] {
      for (gpu::DeviceBatch& b : minibatches) {
        trainer.add_input_wait(seconds_since(t0));
        trainer.step(b);
        trainer.wait_for(trainer.compute());
        t0 = Clock::now();
      }
      minibatches.clear();
    };
    // Crops one input batch out of the shuffle buffer, if it has one, and trains on it.
    const auto crop_some = [&](bool closing) {
      items.clear();
      if (shuffle.try_pop_many(items, o.image_batch, closing) == 0) return false;
      augment(std::move(items), emit, ctx);
      train_all();
      return true;
    };
    for (std::uint64_t id = 0; id < n; ++id) {
      if (trainer.stop_requested()) return;
      for (Item item = read(id); !shuffle.try_push(std::move(item));)  // full: make room first
        if (!crop_some(false)) throw std::logic_error("sync mode: the shuffle buffer is full yet cannot be popped");
    }
    shuffle.close();
    while (crop_some(true)) {
    }
    augment.end_epoch(emit, ctx);
    train_all();
    trainer.add_input_wait(seconds_since(t0));
    shuffle.reopen(derive_seed(o.seed, epoch, 0x73796e63));
    report.epochs.push_back(trainer.end_epoch(test));
  }
}

void train_sync_gpu(const TrainOptions& o, std::shared_ptr<const IdxDataset> data, Trainer& trainer,
                    const TestSet& test, TrainReport& report) {
  gpu::GpuAugment augment = make_gpu_augment(o, data, trainer.device(), trainer.device_ptr());
  report.resident = augment.is_resident();
  const std::uint64_t n = data->size();
  if (augment.is_resident())
    return train_sync_gpu_items<std::uint64_t>(o, n, std::identity{}, augment, trainer, test, report);
  const IdxReader reader(std::move(data), {.pool = BufferPool::create()});
  train_sync_gpu_items<Sample>(
      o, n, [&](std::uint64_t id) { return reader.read(id); }, augment, trainer, test, report);
}

// A device that is not there, or not a device, is a bad argument for this machine, reported
// as such.
std::shared_ptr<gpu::Device> open_device(const std::string& which) {
  try {
    return gpu::Device::open(which);
  } catch (const gpu::DeviceError&) {
    throw;  // a device that is there but fails is not the user's mistake
  } catch (const std::exception& e) {
    throw std::invalid_argument("--device " + which + ": " + e.what());
  }
}

// The rank's place among the ranks of its machine, as the MPI launcher (Open MPI, MPICH) or
// Slurm tells it; nullopt when none does.
std::optional<int> local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* value = std::getenv(name)) {
      char* end = nullptr;
      const long rank = std::strtol(value, &end, 10);
      if (end != value && *end == '\0' && rank >= 0 && rank <= std::numeric_limits<int>::max())
        return static_cast<int>(rank);
    }
  return std::nullopt;
}

}  // namespace

void validate(const TrainOptions& o, int ranks) {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  auto at_least_1 = [&](const char* name, auto value) {
    if (value < 1) fail(std::string(name) + " must be at least 1");
  };
  at_least_1("--epochs", o.epochs);
  if (o.graph != "auto" && o.graph != "no") fail("--graph must be auto or no, not '" + o.graph + "'");
  at_least_1("--batch-size", o.batch_size);
  at_least_1("--crops", o.crops);
  at_least_1("--crop-size", o.crop_size);
  at_least_1("--crop-threads", o.crop_threads);
  at_least_1("--collate-threads", o.collate_threads);
  at_least_1("--read-queue", o.read_queue);
  at_least_1("--batch-queue", o.batch_queue);
  at_least_1("--staging-buffers", o.staging_buffers);
  at_least_1("--in-flight", o.in_flight);
  at_least_1("--image-batch", o.image_batch);
  if (o.threads < 0) fail("--threads must be 0 (one per core) or more");
  if (!(o.mirror_p >= 0 && o.mirror_p <= 1)) fail("--mirror-p must be in [0, 1]");
  if (o.min_after_dequeue >= o.shuffle_capacity)
    fail("--min-after-dequeue (" + std::to_string(o.min_after_dequeue) + ") must be less than --shuffle-capacity (" +
         std::to_string(o.shuffle_capacity) + ")");
  if (o.batch_size > o.shuffle_capacity - o.min_after_dequeue)
    fail("--batch-size (" + std::to_string(o.batch_size) +
         ") must be at most --shuffle-capacity minus --min-after-dequeue (" +
         std::to_string(o.shuffle_capacity - o.min_after_dequeue) + "), what a shuffle buffer can hand out at once");
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda" && !o.device.starts_with("cuda:"))
    fail("--device must be auto, cpu, cuda or cuda:N, not '" + o.device + "'");
  if (o.augment != "cpu" && o.augment != "gpu") fail("--augment must be cpu or gpu, not '" + o.augment + "'");
  if (o.resident != "auto" && o.resident != "yes" && o.resident != "no")
    fail("--resident must be auto, yes or no, not '" + o.resident + "'");
  if (o.mode != "pipelined" && o.mode != "sync") fail("--mode must be pipelined or sync, not '" + o.mode + "'");
  if (std::any_of(o.hidden.begin(), o.hidden.end(), [](int w) { return w < 1; }))
    fail("--hidden widths must be at least 1");
  if (!(o.learning_rate > 0 && std::isfinite(o.learning_rate))) fail("--lr must be positive");
  if (!(o.momentum >= 0 && o.momentum < 1)) fail("--momentum must be in [0, 1)");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay))) fail("--weight-decay must be 0 or more");
  if (!o.checkpoint.empty() || !o.resume.empty()) {
    const char* which = o.checkpoint.empty() ? "--resume" : "--checkpoint";
    if (o.mode != "pipelined" || o.augment != "cpu")
      fail(std::string(which) + " needs --mode pipelined and --augment cpu");
  }
  if (o.checkpoint_every != 0 && o.checkpoint.empty()) fail("--checkpoint-every needs --checkpoint DIR");
  if (o.mode == "sync") {  // what only a pipeline has, refused rather than silently left out
    for (const auto& [option, given] : {std::pair{"--occupancy-log", !o.occupancy_log.empty()},
                                        std::pair{"--trace", !o.trace.empty()}, std::pair{"--autotune", o.autotune}})
      if (given) fail(std::string(option) + " needs --mode pipelined: sync mode runs no pipeline to record or tune");
  }
  if (!(o.rank_timeout >= 0 && std::isfinite(o.rank_timeout)))
    fail("--rank-timeout must be 0 (wait as long as it takes) or more seconds");
  if (o.on_bad_input != "fail" && o.on_bad_input != "skip")
    fail("--on-bad-input must be fail or skip, not '" + o.on_bad_input + "'");
  if (o.images.empty()) {
    if (!o.test_images.empty()) fail("--test-images needs --images");
    if (o.image_size != 0) fail("--image-size needs --images (the IDX images' crops are --crop-size)");
    if (o.on_bad_input != "fail") fail("--on-bad-input skip needs --images (the IDX files are read whole)");
  }
  if (!o.cache.empty() && !is_url(o.images) && !is_url(o.test_images))
    fail("--cache keeps shards read from a URL: neither --images nor --test-images is one (http(s)://, s3://)");
  if (o.cache.empty() != (o.cache_bytes == 0)) fail("--cache and --cache-bytes go together");
  if (!o.images.empty() && (o.mode != "pipelined" || o.augment != "cpu" || o.remote_workers)) {
    fail("--images needs --mode pipelined and --augment cpu, and no --remote-workers");
  }
  if (o.remote_workers) {
    if (ranks < 2)
      fail(
          "--remote-workers needs 2 or more ranks (mpirun -np N stoker-train --remote-workers): rank 0 trains, "
          "the others make its batches");
    if (o.deterministic)
      fail(
          "--remote-workers cannot be combined with --deterministic: the order the batches arrive in depends on how "
          "fast each worker makes them");
  }
  if (ranks > 1) {
    const std::string job = " (a job of " + std::to_string(ranks) + " ranks)";
    if (o.mode != "pipelined" || o.augment != "cpu")
      fail("several ranks need --mode pipelined and --augment cpu" + job);
    if (!o.remote_workers && o.batch_size % static_cast<std::size_t>(ranks) != 0)
      fail("--batch-size " + std::to_string(o.batch_size) + " does not divide among " + std::to_string(ranks) +
           " ranks, which take equal shares of a step: give a multiple of " + std::to_string(ranks) + job);
  }
}

std::size_t default_batch_for(std::size_t batch_size, int ranks) {
  if (ranks < 2) return batch_size;
  const auto n = static_cast<std::size_t>(ranks);
  return std::max<std::size_t>(1, (batch_size + n / 2) / n) * n;
}

std::string device_for_rank(const std::string& device, std::optional<int> local_rank, int ranks, int cuda_devices) {
  if (ranks < 2 || !local_rank || cuda_devices < 1 || (device != "auto" && device != "cuda")) return device;
  return "cuda:" + std::to_string(*local_rank % cuda_devices);
}

std::uint64_t sample_digest(std::uint32_t epoch, std::uint64_t id) noexcept { return derive_seed(epoch, id, 0x646967); }

std::uint64_t TrainReport::samples() const {
  std::uint64_t n = 0;
  for (const EpochReport& e : epochs) n += e.samples;
  return n;
}
std::uint64_t TrainReport::trained_samples() const {
  std::uint64_t n = 0;
  for (const EpochReport& e : epochs) n += e.trained_samples();
  return n;
}
std::uint64_t TrainReport::batches() const {
  std::uint64_t n = 0;
  for (const EpochReport& e : epochs) n += e.batches;
  return n;
}
double TrainReport::train_seconds() const {
  double s = 0;
  for (const EpochReport& e : epochs) s += e.train_seconds;
  return s;
}
double TrainReport::samples_per_s() const {
  if (!ranks.empty()) {  // every rank's samples over the slowest rank's time
    std::uint64_t n = 0;
    double slowest = 0;
    for (const Rank& r : ranks) {
      n += r.trained_samples;
      slowest = std::max(slowest, r.train_seconds);
    }
    return slowest > 0 ? static_cast<double>(n) / slowest : 0;
  }
  const double s = train_seconds();
  return s > 0 ? static_cast<double>(trained_samples()) / s : 0;
}
double TrainReport::starvation() const {
  double wait = 0;
  for (const EpochReport& e : epochs) wait += e.input_wait_seconds;
  const double s = train_seconds();
  return s > 0 ? wait / s : 0;
}

namespace {

// Every rank's samples and times at rank 0, and a check that their weights are the same.
void gather_ranks(cluster::Communicator& ranks, Trainer& trainer, TrainReport& report) {
  std::uint64_t wait = 0, exchange = 0;
  for (const EpochReport& e : report.epochs) {
    wait += static_cast<std::uint64_t>(e.input_wait_seconds * 1e9);
    exchange += static_cast<std::uint64_t>(e.exchange_wait_seconds * 1e9);
  }
  // Then the digests: the run's, what this process trained, each epoch's and the interrupted one's.
  std::string mine = std::to_string(report.samples()) + " " + std::to_string(report.trained_samples()) + " " +
                     std::to_string(static_cast<std::uint64_t>(report.train_seconds() * 1e9)) + " " +
                     std::to_string(wait) + " " + std::to_string(trainer.weights_hash()) + " " +
                     std::to_string(exchange) + " " + std::to_string(trainer.run_digest()) + " " +
                     std::to_string(trainer.trained_digest());
  for (const EpochReport& e : report.epochs) mine += " " + std::to_string(e.digest);
  if (report.interrupted) mine += " " + std::to_string(report.interrupted->digest);
  const auto records = ranks.gather(mine);
  if (records.empty()) return;  // not rank 0
  report.digest = 0;
  for (EpochReport& e : report.epochs) e.digest = 0;
  if (report.interrupted) report.interrupted->digest = 0;
  std::uint64_t first_hash = 0;
  for (std::size_t r = 0; r < records.size(); ++r) {
    std::istringstream in(records[r]);
    std::uint64_t samples = 0, trained = 0, seconds = 0, waited = 0, hash = 0, exchange = 0, run = 0, own = 0;
    in >> samples >> trained >> seconds >> waited >> hash >> exchange >> run >> own;
    if (r == 0) first_hash = hash;
    if (hash != first_hash)
      throw std::logic_error("the weights of rank " + std::to_string(r) + " differ from rank 0's after training");
    report.ranks.push_back({samples, trained, static_cast<double>(seconds) * 1e-9, static_cast<double>(waited) * 1e-9,
                            static_cast<double>(exchange) * 1e-9, own});
    report.digest += run;
    std::uint64_t epoch_digest = 0;
    for (EpochReport& e : report.epochs) e.digest += (in >> epoch_digest, epoch_digest);
    if (report.interrupted) report.interrupted->digest += (in >> epoch_digest, epoch_digest);
    if (!in) throw std::logic_error("rank " + std::to_string(r) + " reported other epochs than rank 0");
  }
}

}  // namespace

namespace {

// A hash of every byte of the data set, images and labels: ranks that read different copies
// (a host with a partial one) differ in it.
std::string content_hash(const IdxDataset& d) {
  std::uint64_t h = derive_seed(d.size(), d.images.height, d.images.width);
  const auto add = [&](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, p + i, 8);
      h = mix64(h ^ word);
    }
    for (; i < bytes; ++i) h = mix64(h ^ p[i]);
  };
  add(d.images.pixels.data(), d.images.pixels.size());
  add(d.labels.data(), d.labels.size() * sizeof(d.labels[0]));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(d.size()) + " images of " + d.shape().str() + ", content hash " + hex;
}

// What every rank of a job reads, opens and checks before the first step.
struct Setup {
  std::shared_ptr<const IdxDataset> train, test;  // test: trainers only; none with --images
  ImageSets images;                               // --images
  TestCrops test_crops;                           // --images, trainers only
  std::shared_ptr<gpu::Device> device;            // trainers only
  std::optional<Checkpoint> checkpoint;           // --resume
  // What the training set is, for the ranks to agree on and checkpoints to record: a hash of
  // every byte of the IDX files, or of every image file's name and label (--images: the files'
  // bytes would cost an epoch's reading).
  std::string data;
};

Setup set_up(const TrainOptions& options, int world, int trainers, bool trainer) {
  validate(options, world);
  Setup s;
  if (trainer)  // before the data: a device that cannot be had is the first thing to hear of
    s.device = open_device(device_for_rank(options.device, local_rank(), trainers, gpu::cuda_device_count()));
  if (!options.images.empty()) {
    s.images = open_image_sets(options);
    if (trainer) {
      TrainOptions sized = options;  // the test crops are --image-size's
      if (sized.image_size != 0) sized.crop_size = sized.image_size;
      s.test_crops = decode_test_crops(s.images.test, sized, fashion_normalization());
      if (s.test_crops.crops.empty()) throw DataError(s.images.test_source, "no test image could be decoded");
    }
  } else {
    s.train = std::make_shared<const IdxDataset>(load(options, "train"));
    if (s.train->size() == 0) throw DataError(options.data, "the training set is empty");
    if (options.crop_size > s.train->images.height || options.crop_size > s.train->images.width)
      throw std::invalid_argument("--crop-size " + std::to_string(options.crop_size) + " does not fit the " +
                                  s.train->shape().str() + " images");
    if (trainer) {
      s.test = std::make_shared<const IdxDataset>(load(options, "t10k"));
      if (s.test->size() == 0) throw DataError(options.data, "the test set is empty");
    }
  }
  s.data = s.train ? content_hash(*s.train) : s.images.train->fingerprint();
  if (!options.resume.empty()) {
    s.checkpoint = Checkpoint::load(options.resume);
    s.checkpoint->check_options(options, s.data, options.resume);
  }
  return s;
}

// What must be the same on every rank for the job's collectives to line up and its replicas
// to stay one model: `problem` is what this rank could not do (empty when nothing).
cluster::Facts job_facts(const TrainOptions& o, const Setup& s, int trainers, const std::string& problem) {
  cluster::Facts facts{{"its setup", problem.empty() ? "ok" : problem}};
  const auto option = [&](const char* name, const auto& value) {
    std::ostringstream out;
    out << value;
    facts.emplace_back(name, out.str());
  };
  // The options that decide the run, and the training data.
  for (const auto& [name, value] : Checkpoint::options_of(o, s.data)) facts.emplace_back(name, value);
  option("--batch-size", o.batch_size);
  option("--shuffle-capacity", o.shuffle_capacity);
  option("--min-after-dequeue", o.min_after_dequeue);
  option("--mode", o.mode);
  option("--augment", o.augment);
  option("--limit", o.limit);
  option("--deterministic", o.deterministic ? "on" : "off");
  option("--checkpoint", o.checkpoint.empty() ? "none" : "given");  // rank 0 writes it
  option("--checkpoint-every", o.checkpoint_every);
  if (s.train || s.images.train) {
    const std::uint64_t size = s.train ? s.train->size() : s.images.train->size();
    const std::uint64_t samples = size / static_cast<std::uint64_t>(trainers) * static_cast<std::uint64_t>(o.crops);
    const std::size_t batch = o.batch_size / static_cast<std::size_t>(trainers);
    option("steps per epoch", (samples + batch - 1) / batch);
  }
  if (s.checkpoint)
    facts.emplace_back("the checkpoint resumed", "step " + std::to_string(s.checkpoint->step) + " of a job of " +
                                                     std::to_string(s.checkpoint->pipelines.size()) + " ranks, hash " +
                                                     std::to_string(s.checkpoint->file_hash));
  return facts;
}

// The ranks on this rank's machine, as the MPI launcher (Open MPI, MPICH) or Slurm tells it; 0
// when none does.
int local_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* value = std::getenv(name)) {
      const long n = std::strtol(value, nullptr, 10);
      if (n > 0 && n <= std::numeric_limits<int>::max()) return static_cast<int>(n);
    }
  return 0;
}

}  // namespace

std::string binding_record(int cpus, int cores, int local_ranks) {
  return std::to_string(cpus) + " " + std::to_string(cores) + " " + std::to_string(local_ranks);
}

std::string binding_advice(const std::vector<std::string>& records, int threads) {
  struct Seen {
    int cpus = 0, cores = 0, local = 0;
  };
  std::vector<Seen> seen(records.size());
  std::vector<int> squeezed, shared;
  for (std::size_t r = 0; r < records.size(); ++r) {
    Seen& x = seen[r];
    std::istringstream(records[r]) >> x.cpus >> x.cores >> x.local;
    if (x.cpus <= 0 || x.cores <= 0 || x.local <= 0) continue;  // not known: nothing to say
    const int share = std::max(1, x.cores / x.local);
    if (x.cpus < share)
      squeezed.push_back(static_cast<int>(r));
    else if ((threads > 0 ? threads : x.cpus) > share)
      shared.push_back(static_cast<int>(r));
  }
  if (squeezed.empty() && shared.empty()) return {};
  const Seen& example = seen[static_cast<std::size_t>(squeezed.empty() ? shared.front() : squeezed.front())];
  const int share = std::max(1, example.cores / example.local);
  const std::string cores_each = "--map-by ppr:" + std::to_string(example.local) + ":node:pe=" + std::to_string(share);
  if (!squeezed.empty())
    return cluster::rank_list(squeezed) + " may run on " + std::to_string(example.cpus) + " of the " +
           std::to_string(example.cores) + " cores of a machine of " + std::to_string(example.local) +
           " ranks (the launcher bound them): each pipeline gets " + std::to_string(example.cpus) +
           " threads where it could have " + std::to_string(share) + "; launch with " + cores_each +
           ", or --bind-to none and give --threads " + std::to_string(share) + " (docs/scale-out.md)";
  const int others = example.local - 1;
  return cluster::rank_list(shared) + " each run a pipeline of " +
         std::to_string(threads > 0 ? threads : example.cpus) + " threads on cores they share with " +
         std::to_string(others) + " other rank" + (others == 1 ? "" : "s") + " (a machine of " +
         std::to_string(example.cores) + " cores): give --threads " + std::to_string(share) + ", or launch with " +
         cores_each + " (docs/scale-out.md)";
}

namespace {

// binding_advice() of every rank's CPU set, gathered at rank 0 (a collective).
std::string gather_binding_advice(cluster::Communicator& world, int threads) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  const auto records =
      world.gather(binding_record(cpus, static_cast<int>(std::thread::hardware_concurrency()), local_ranks()));
  return world.rank() == 0 ? binding_advice(records, threads) : std::string();
}

}  // namespace

TrainReport run_training(const TrainOptions& given, const TrainCallbacks& callbacks, cluster::Communicator* ranks) {
  TrainOptions options = given;
  if (!options.budget && options.threads >= 0)
    options.budget = std::make_shared<ThreadBudget>(options.threads);  // else: validate() says why
  const int world = ranks ? ranks->size() : 1;
  const int trainers = options.remote_workers ? 1 : world;
  const bool trains = !options.remote_workers || !ranks || ranks->rank() == 0;
  const auto t_load = Clock::now();
  Setup setup;
  if (world == 1) {
    setup = set_up(options, world, trainers, trains);
  } else {
    ranks->set_timeout(std::chrono::milliseconds(static_cast<std::int64_t>(options.rank_timeout * 1000)));
    ranks->set_status("setting up: reading its data, opening its device");
    // What a rank cannot do is one of its facts: every rank stops together, rather than one
    // leaving the others waiting at the first collective.
    std::exception_ptr problem;
    std::string what;
    try {
      setup = set_up(options, world, trainers, trains);
    } catch (const std::exception& e) {
      problem = std::current_exception();
      what = e.what();
    }
    cluster::agree(*ranks, job_facts(options, setup, trainers, what));
    if (problem) std::rethrow_exception(problem);  // the same on every rank: rank 0 reports it
  }
  TrainReport report;
  if (world > 1) report.binding = gather_binding_advice(*ranks, options.threads);
  // Remote workers: rank 0 alone trains, on whole steps; the others make its batches.
  std::optional<cluster::RemoteEdge<cluster::Bytes>> edge;
  if (options.remote_workers) {
    // Room for a queue of batches per worker on their way to rank 0.
    std::optional<cluster::RemoteProgress> progress;
    if (setup.checkpoint && setup.checkpoint->plan) {
      const auto& plan = *setup.checkpoint->plan;
      progress = cluster::RemoteProgress{plan.epoch(), plan.samples(), plan.fanout(), plan.units_of(0)};
    }
    edge.emplace(*ranks, cluster::RemoteOptions{
                             .name = "batches",
                             .trainer = 0,
                             .capacity = options.batch_queue * static_cast<std::size_t>(world - 1),
                             .lease = std::chrono::milliseconds(static_cast<std::int64_t>(options.rank_timeout * 1000)),
                             .resume = std::move(progress)});
    if (edge->role() == cluster::RemoteRole::worker) {
      make_remote_batches(options, std::move(setup.train), *edge, {ranks->rank(), world, "worker"});
      report.worker = true;
      return report;
    }
  }
  TrainOptions o = options;  // this rank's: its share of each step
  o.batch_size /= static_cast<std::size_t>(trainers);
  if (o.image_size != 0) o.crop_size = o.image_size;
  report.mode = o.mode;
  auto train_data = std::move(setup.train);
  auto test_data = std::move(setup.test);
  ImageSets images = std::move(setup.images);
  if (train_data) {
    report.train_images = train_data->size();
    report.test_images = test_data->size();
  } else {
    report.train_images = images.train->size();
    report.test_images = images.test->size();
    report.test_source = images.test_source;
    report.skipped_images = setup.test_crops.skipped;
  }

  // A rank's share of an epoch (ShuffledShard leaves out the remainder); all of it alone.
  const std::uint64_t samples_per_epoch =
      report.train_images / static_cast<std::uint64_t>(trainers) * static_cast<std::uint64_t>(o.crops);
  Trainer trainer(o, callbacks, std::move(setup.device), samples_per_epoch, edge ? nullptr : ranks, ranks);
  trainer.set_data(report.train_images, setup.data);
  if (setup.checkpoint) trainer.resume(*setup.checkpoint, o.resume);
  const TestSet test = test_data ? upload_test_set(test_data, o, trainer.device(), trainer.compute())
                                 : upload_test_set(std::move(setup.test_crops.crops), trainer.device(), trainer.compute());
  report.device = gpu::backend_name(trainer.device().backend());
  report.device_name = trainer.device().name();
  report.parameters = trainer.model().parameter_count();
  report.load_seconds = seconds_since(t_load);
  if (callbacks.on_start) callbacks.on_start(report);

  const bool gpu_augment = o.augment == "gpu";
  if (edge)
    train_remote(o, *edge, trainer, test, report, {ranks->rank(), world, "trainer"});
  else if (images.train)
    train_pipelined_images(o, std::move(images.train), trainer, test, report);
  else if (o.mode == "sync")
    (gpu_augment ? train_sync_gpu : train_sync)(o, std::move(train_data), trainer, test, report);
  else
    (gpu_augment ? train_pipelined_gpu : train_pipelined)(o, std::move(train_data), trainer, test, report);
  report.transfers = trainer.device().transfers();
  report.graph_steps = trainer.graph_steps();
  report.graph = report.graph_steps > 0;
  if (trainer.stopped()) report.interrupted = trainer.current();
  report.digest = trainer.run_digest();
  report.digest_known = trainer.digest_known();
  if (trainers > 1) gather_ranks(*ranks, trainer, report);
  return report;
}

}  // namespace stoker::train
