// SPDX-License-Identifier: Apache-2.0
// stoker-train's training run, apart from its command line so that tests can run it: an MLP
// trained on Fashion-MNIST crops fed by a stoker pipeline (or, in sync mode, by the same work
// done one step after another), evaluated on the test set after every epoch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/core/stage_stats.h"
#include "stoker/core/thread_budget.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/idx.h"

namespace stoker::cluster {
class Communicator;
}

namespace stoker::train {

struct TrainOptions {
  std::string data = kFashionMnistDir;  ///< holds train-* and t10k-* IDX files
  std::uint32_t epochs = 10;
  std::size_t batch_size = 255;
  int crops = 5;  ///< random crops per training image
  /// Square crops; the test set gets center crops of this size. 26 rather than the reference
  /// job's 24: an MLP has no translation invariance, and the +-2 pixel shifts of 24x24 crops
  /// of 28x28 images cost it about two points of test accuracy at this budget (docs/train.md).
  std::uint32_t crop_size = 26;
  double mirror_p = 0.5;  ///< probability of mirroring a crop left-right

  // The pipeline (pipelined mode).
  int threads = 0;                  ///< oneTBB threads for all stages; 0 = one per core
  /// What the run's pipelines (the test set's, training's) share: `threads` stage bodies at
  /// once, whichever runs. Made by run_training() when none is given.
  std::shared_ptr<ThreadBudget> budget;
  int crop_threads = 2;             ///< bodies of the crop stage
  int collate_threads = 1;          ///< bodies of the collate stage
  bool autotune = false;            ///< move threads between crops and collate as it runs, within `threads`
  std::size_t read_queue = 64;      ///< images between the reader and the crop stage
  std::size_t batch_queue = 4;      ///< batches between batcher, collate, copy and trainer
  std::size_t staging_buffers = 4;  ///< pinned buffers batches are collated into
  /// The shuffle buffer of crops (--augment cpu); with --augment gpu, both the shuffle buffer of
  /// images on the host and the window of crops on the device.
  std::size_t shuffle_capacity = 10'000;
  std::size_t min_after_dequeue = 2'000;
  std::size_t image_batch = 512;  ///< --augment gpu: whole images per copy to the device
  /// --augment gpu: upload the data set once and send only crop lists: auto (when on a GPU
  /// and the data set takes at most a quarter of its free memory), yes or no.
  std::string resident = "auto";
  std::string occupancy_log;  ///< JSON Lines file for stoker-inspect; empty = none
  std::string trace;          ///< Chrome trace event file of the pipeline; empty = none
  /// The same batches, in the same order, whatever the threads (PipelineBuilder::deterministic);
  /// checkpoints need it.
  bool deterministic = false;
  std::string checkpoint;              ///< directory checkpoints are written to; empty = none
  std::uint64_t checkpoint_every = 0;  ///< training steps between checkpoints; 0 = only at the end
  std::string resume;                  ///< checkpoint directory to go on from; empty = from the start
  /// Rank 0 trains; every other rank runs read -> crops -> shuffle -> batch -> collate on
  /// shards it asks rank 0 for, and sends it the batches (a remote edge, docs/scale-out.md). A
  /// worker silent for --rank-timeout loses its work to the others.
  bool remote_workers = false;
  /// Seconds a rank waits for the others (a collective, a worker's batches, rank 0's answers)
  /// before it ends the job naming the rank that stopped answering; 0: as long as it takes.
  double rank_timeout = 300;

  std::uint64_t seed = 1;  ///< crops, mirrors, shuffle and initial weights
  /// auto, cpu, cuda (the current CUDA device) or cuda:N; in a job of several ranks, auto and
  /// cuda give each rank of a machine its own GPU (device_for_rank).
  std::string device = "auto";
  std::string augment = "cpu";     ///< cpu (crops on host threads) or gpu (crops on the device)
  std::string mode = "pipelined";  ///< pipelined or sync

  // The model and its optimizer.
  std::vector<int> hidden{256, 128};  ///< hidden layer widths
  float learning_rate = 0.05f;        ///< of SGD at the start; decays to 0 along a cosine
  float momentum = 0.9f;
  float weight_decay = 5e-4f;  ///< L2
  /// Training steps queued on the device before the trainer waits (asleep, on a blocking-sync
  /// event): deep enough that a host which is the bottleneck never leaves the device idle while
  /// it catches up, and every one of them costs a device buffer of input (output_sizing).
  int in_flight = 4;
  /// auto: on a CUDA device in a job of one rank, each full training step is one launch of a
  /// CUDA graph captured from the first (its input copied to where the graph reads it); no:
  /// every step's kernels launched one by one.
  std::string graph = "auto";

  std::size_t limit = 0;  ///< use only the first N train and N test images; 0 = all

  /// Image files to train on instead of the IDX files: a list file of `path label` lines or a
  /// class folder, decoded to gray, cropped as the IDX images are (crop_size); empty = the IDX files.
  std::string images;
  /// With `images`: the crops' side, which may be larger than 28 (0: crop_size).
  std::uint32_t image_size = 0;
  /// The test set's image files; empty = a tenth of `images` drawn at random (the same every
  /// run), held out.
  std::string test_images;
  /// With `images` (or `test_images`) at a URL: a folder that keeps whole shards on the local disk
  /// (RemoteOptions::cache_dir), and the most bytes it holds; empty: no cache.
  std::string cache;
  std::uint64_t cache_bytes = 0;
  /// What a bad image file does: fail (the run stops, naming the file) or skip (it is counted
  /// in skipped_images and left out).
  std::string on_bad_input = "fail";
};

/// Throws std::invalid_argument naming the first bad option, for a job of `ranks` processes.
void validate(const TrainOptions& options, int ranks = 1);

/// The batch of a data-parallel job of `ranks` for the default `batch_size`: the nearest
/// multiple of `ranks`, so that each rank takes an equal share (255 is 256 on 2 and 4 ranks).
std::size_t default_batch_for(std::size_t batch_size, int ranks);

/// The device buffers the trainer's input stage (h2d, or gpu_augment) needs, whose one call
/// holds `per_call` of them: those queued for the trainer (batch_queue), and those the trainer
/// holds at once: the batch it is issuing and the in_flight steps queued on the device.
gpu::OutputSizing output_sizing(const TrainOptions& options, std::size_t per_call);

/// The device a rank opens for --device `device`: in a job of several ranks, `auto` and `cuda`
/// become cuda:(local_rank % cuda_devices), so that the ranks of one machine (local_rank among
/// them, as the launcher says) each use their own GPU; anything else, or one rank, as given.
std::string device_for_rank(const std::string& device, std::optional<int> local_rank, int ranks, int cuda_devices);

/// One rank's CPU set as binding_advice() reads it: the CPUs it may run on (sched_getaffinity),
/// its machine's cores, and the ranks on that machine (0: not known).
std::string binding_record(int cpus, int cores, int local_ranks);
/// Whether the ranks' CPU sets (binding_record(), in rank order) give each pipeline its share of
/// its machine's cores (cores / ranks there): empty when they do; otherwise which ranks are
/// squeezed into fewer cores (mpirun binds each of 2 ranks to one core by default), or run
/// more threads than their share on cores they share (it binds more ranks to a whole socket),
/// and the launch line or --threads that gives each its share. `threads`: --threads (0: one
/// per core of the rank's CPU set, as oneTBB counts them).
std::string binding_advice(const std::vector<std::string>& records, int threads);

struct EpochReport {
  std::uint32_t epoch = 0;  ///< from 1
  /// The epoch's, from its start: after --resume, those trained before the checkpoint too.
  std::uint64_t samples = 0, batches = 0;
  /// After --resume, the part of `samples` and `batches` trained before the checkpoint, by the
  /// run that wrote it; 0 otherwise.
  std::uint64_t resumed_samples = 0, resumed_batches = 0;
  double loss = 0;  ///< mean training cross-entropy
  double train_accuracy = 0, test_accuracy = 0;
  double train_seconds = 0;        ///< this process's: first batch asked for -> last step done
  double input_wait_seconds = 0;   ///< trainer waiting for its next batch
  double device_wait_seconds = 0;  ///< trainer waiting for the device to catch up
  /// Data-parallel: in the gradient exchange, waiting for the other ranks (and the transfer).
  double exchange_wait_seconds = 0;
  double eval_seconds = 0;
  /// Which samples the epoch trained on: the sum, modulo 2^64, of sample_digest(epoch, id) over
  /// the crops trained (id: Sample::id), whatever their order or rank. From the epoch's start:
  /// after --resume, with the checkpoint's digest of it. This process's share until
  /// run_training returns, every rank's in TrainReport::epochs.
  std::uint64_t digest = 0;

  /// The samples this process trained on.
  std::uint64_t trained_samples() const { return samples - resumed_samples; }
  /// This process's: the samples it trained on over the time it took.
  double samples_per_s() const {
    return train_seconds > 0 ? static_cast<double>(trained_samples()) / train_seconds : 0;
  }
  /// Share of the training time spent waiting for input, in [0, 1].
  double starvation() const { return train_seconds > 0 ? input_wait_seconds / train_seconds : 0; }
};

struct TrainReport {
  std::string device;       ///< "cuda" or "cpu"
  std::string device_name;  ///< e.g. "NVIDIA H100 80GB HBM3 (cuda:0)"
  std::string mode;
  bool resident = false;  ///< the data set was uploaded once (--augment gpu)
  bool graph = false;     ///< full training steps ran as one CUDA graph launch each
  std::uint64_t graph_steps = 0;  ///< the steps that did (all full ones but the first)
  std::uint64_t train_images = 0, test_images = 0;
  std::string test_source;  ///< with --images: where the test images came from
  /// With --images: bad files left out (--on-bad-input skip), every epoch's and the test set's.
  std::uint64_t skipped_images = 0;
  std::size_t parameters = 0;
  double load_seconds = 0;  ///< reading and decoding the data sets, preparing the test set
  std::vector<EpochReport> epochs;
  std::optional<PipelineSummary> pipeline;  ///< pipelined mode only
  gpu::TransferCounts transfers;            ///< copies of the whole run, setup included

  /// A data-parallel job's ranks (filled at rank 0; one entry per rank, in rank order).
  struct Rank {
    std::uint64_t samples = 0;
    std::uint64_t trained_samples = 0;  ///< of `samples`, those this run trained (not before --resume)
    double train_seconds = 0, input_wait_seconds = 0;
    double exchange_wait_seconds = 0;  ///< in the gradient exchange: the slowest rank waits least
    std::uint64_t digest = 0;          ///< of what this rank trained, as TrainReport::digest (--resume: not before it)
    double samples_per_s() const {
      return train_seconds > 0 ? static_cast<double>(trained_samples) / train_seconds : 0;
    }
    double starvation() const { return train_seconds > 0 ? input_wait_seconds / train_seconds : 0; }
  };
  std::vector<Rank> ranks;
  /// Under mpirun, at rank 0: which ranks' CPU sets give their pipelines fewer cores than their
  /// share of the machine, or more threads than their share, and the launch line that would
  /// not; empty when every rank has its share, or the launcher does not say how many share.
  std::string binding;
  /// --remote-workers: this rank made batches for rank 0 and has nothing else to report.
  bool worker = false;
  std::uint32_t remote_workers = 0;  ///< at rank 0: the ranks that made its batches
  std::uint64_t remote_bytes = 0;    ///< at rank 0: what they sent
  std::size_t remote_peak = 0;       ///< at rank 0: the most batches sent and not yet taken at once
  /// At rank 0 with remote workers: the images of the data set each worker was handed, in rank
  /// order (a slow worker takes fewer).
  struct Worker {
    int rank = 0;
    std::uint64_t images = 0;
  };
  std::vector<Worker> workers;
  std::vector<int> remote_lost;      ///< at rank 0: workers whose lease ran out (their work went to others)
  /// The epoch the run was stopped in (TrainCallbacks::stop_requested), as far as it went; not
  /// in `epochs`, and not evaluated.
  std::optional<EpochReport> interrupted;
  /// --resume of a run that had finished: nothing was left to train, `epochs` is empty, and
  /// test_accuracy() is that of the checkpoint's model, evaluated on the test set.
  bool nothing_to_train = false;
  double checkpoint_test_accuracy = 0;
  /// Which samples the whole run trained on, every epoch's (EpochReport::digest) summed: after
  /// --resume, those before the checkpoint too, and the interrupted epoch's part. Every rank's.
  /// Equal for two runs that trained the same (epoch, sample) pairs once each, at any world size
  /// and however often stopped and resumed; a sample trained twice or left out changes it.
  std::uint64_t digest = 0;
  /// False after --resume of a checkpoint without digests (before version 3): `digest` and the
  /// resumed epoch's lack what was trained before it.
  bool digest_known = true;

  std::uint64_t samples() const;  ///< every epoch's (EpochReport::samples)
  std::uint64_t batches() const;
  std::uint64_t trained_samples() const;  ///< by this process: samples() less those before --resume
  double train_seconds() const;
  /// This process's trained_samples() over its time; with several ranks, every rank's over the
  /// slowest rank's time.
  double samples_per_s() const;
  double starvation() const;  ///< over all epochs, in [0, 1]
  double test_accuracy() const { return epochs.empty() ? checkpoint_test_accuracy : epochs.back().test_accuracy; }
};

struct TrainCallbacks {
  std::function<void(const TrainReport&)> on_start;  ///< data loaded, device open
  /// After each step is issued: the epoch (from 1), samples so far in it, samples in it.
  std::function<void(std::uint32_t, std::uint64_t, std::uint64_t)> on_batch;
  std::function<void(const EpochReport&)> on_epoch;
  /// Asked before each step: true stops the run there, as if its last epoch ended, except that
  /// the epoch is not evaluated; the pipeline stops and closes its occupancy log and trace, and
  /// with --checkpoint the checkpoint is written where the run stood (TrainReport::interrupted).
  std::function<bool()> stop_requested;
};

/// A crop's part of EpochReport::digest: crop `id` (Sample::id) trained in epoch `epoch` (from 1).
std::uint64_t sample_digest(std::uint32_t epoch, std::uint64_t id) noexcept;

/// Loads the data, opens the device and trains. Throws std::invalid_argument for bad options
/// (a device asked for that is not there included), DataError for missing or bad data files,
/// and StageError when a stage of the pipeline fails.
///
/// With a communicator of several ranks, the ranks first agree (cluster::agree) on what must be
/// the same on all of them: the options that decide the run, the training data (a hash of all
/// of it), the steps of an epoch, the model, the checkpoint resumed from, and whether the rank
/// could read its data and open its device; a rank that differs is named and every rank throws
/// cluster::RankMismatch before the first step.
///
/// With a communicator of several ranks, data-parallel: each rank trains on its share of every
/// epoch (ShuffledShard) with `batch_size / ranks` crops per step, and the gradients are
/// averaged over the ranks every step, so that a step is one of `batch_size` crops, as in one
/// process. Every rank must call it with the same options.
TrainReport run_training(const TrainOptions& options, const TrainCallbacks& callbacks = {},
                         cluster::Communicator* ranks = nullptr);

}  // namespace stoker::train
