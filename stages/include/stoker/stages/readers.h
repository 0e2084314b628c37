// SPDX-License-Identifier: Apache-2.0
// Every reader: IDX (MNIST), NumPy .npy, raw volumes and synthetic samples.
#pragma once

#include "stoker/stages/idx.h"
#include "stoker/stages/npy.h"
#include "stoker/stages/raw.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/synthetic.h"
