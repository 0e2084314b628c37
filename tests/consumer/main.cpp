// SPDX-License-Identifier: Apache-2.0
// Compiles and links against an installed stoker: proves the exported headers, targets
// and dependencies are complete, and that a queue works across the install boundary.
#include <cstdio>

#include "stoker/core/random_shuffle_queue.h"

int main() {
  stoker::RandomShuffleQueue<int> queue("consumer", {.capacity = 4, .min_after_dequeue = 0, .seed = 7});
  for (int i = 0; i < 4; ++i) {
    if (!queue.push(i)) {
      std::fprintf(stderr, "consumer: push %d failed\n", i);
      return 1;
    }
  }
  queue.close();

  // Drawn in random order: each of 0..3 must come back exactly once.
  unsigned seen = 0;
  int count = 0, value = -1;
  while (queue.pop(value)) {
    if (value < 0 || value > 3 || (seen & (1u << value)) != 0) {
      std::fprintf(stderr, "consumer: popped %d, which was not pushed or came back twice\n", value);
      return 1;
    }
    seen |= 1u << value;
    ++count;
  }
  if (count != 4) {
    std::fprintf(stderr, "consumer: got %d items back, expected 4\n", count);
    return 1;
  }
  std::puts("consumer OK");
  return 0;
}
