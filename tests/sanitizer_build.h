// Which sanitizer this build of the tests runs under, for tests that must skip (saying why)
// where a sanitizer cannot run what they do. Compile-time only.
#pragma once

// FERRY_UNDER_TSAN is defined when built with ThreadSanitizer: __SANITIZE_THREAD__ (GCC) or
// __has_feature (clang).
#if defined(__SANITIZE_THREAD__)
#define FERRY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_UNDER_TSAN 1
#endif
#endif
