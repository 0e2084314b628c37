// SPDX-License-Identifier: Apache-2.0
// Compiles and links against an installed stoker: proves the exported headers, targets
// and dependencies are complete, and that a queue works across the install boundary.
#include <cstdio>

#include "stoker/core/bounded_queue.h"

int main() {
  stoker::BoundedQueue<int> queue("consumer", 4);
  for (int i = 0; i < 4; ++i) {
    if (!queue.push(i)) {
      std::fprintf(stderr, "consumer: push %d failed\n", i);
      return 1;
    }
  }
  queue.close();

  int expected = 0;
  int value = -1;
  while (queue.pop(value)) {
    if (value != expected) {
      std::fprintf(stderr, "consumer: popped %d, expected %d\n", value, expected);
      return 1;
    }
    ++expected;
  }
  if (expected != 4) {
    std::fprintf(stderr, "consumer: got %d items back, expected 4\n", expected);
    return 1;
  }
  std::puts("consumer OK");
  return 0;
}
