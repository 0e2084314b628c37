// All of stoker in one include: the pipeline and its queues (core), samples, readers,
// transforms, batching and DLPack export (stages), the device path (gpu) and the ranks of a job
// (dist). Link stoker::stoker.
#pragma once

#include "stoker/core/bounded_queue.h"
#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/core/random_shuffle_queue.h"
#include "stoker/core/stage.h"
#include "stoker/core/stage_error.h"
#include "stoker/core/stage_stats.h"
#include "stoker/core/state.h"
#include "stoker/dist/communicator.h"
#include "stoker/gpu/augment.h"
#include "stoker/gpu/device.h"
#include "stoker/gpu/dlpack.h"
#include "stoker/gpu/staging.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/dlpack.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/npy.h"
#include "stoker/stages/raw.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/sample.h"
#include "stoker/stages/synthetic.h"
#include "stoker/stages/transforms.h"
