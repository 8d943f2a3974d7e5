#include "kernels/cpu_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace commlib {

#if defined(__x86_64__)
namespace {

// SSE2 is part of x86-64, so the 16-byte streaming store needs no CPU dispatch.
void stream_copy(char* d, const char* s, size_t n) {
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head >= n) {
    std::memcpy(d, s, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  // Streaming stores are weakly ordered: fence before anyone (a peer, the caller) may read them.
  _mm_sfence();
}

}  // namespace
#endif

void copy_bytes(void* dst, const void* src, size_t n, bool stream) {
#if defined(__x86_64__)
  if (stream && n >= 256) {
    stream_copy(static_cast<char*>(dst), static_cast<const char*>(src), n);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, n);
}

}  // namespace commlib
