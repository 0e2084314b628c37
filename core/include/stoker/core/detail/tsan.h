// SPDX-License-Identifier: Apache-2.0
// Happens-before edges for ThreadSanitizer where the ordering comes from a library it does not
// see: libtbb is not built with TSan, so "a task runs after the enqueue that made it" and "a
// parallel_for returns after its chunks" are invisible to it. STOKER_TSAN_RELEASE(p) before the
// hand-off and STOKER_TSAN_ACQUIRE(p) after it, on the same address, state the edge. They compile
// to nothing in other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define STOKER_TSAN_ACQUIRE(p) __tsan_acquire(static_cast<void*>(p))
#define STOKER_TSAN_RELEASE(p) __tsan_release(static_cast<void*>(p))
#else
#define STOKER_TSAN_ACQUIRE(p) ((void)0)
#define STOKER_TSAN_RELEASE(p) ((void)0)
#endif
