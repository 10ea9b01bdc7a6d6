// Symbol visibility: libsalus is built with hidden visibility; only what carries SALUS_API is
// exported from the shared library.
#pragma once

#if defined(SALUS_STATIC_DEFINE)
#define SALUS_API
#else
#define SALUS_API __attribute__((visibility("default")))
#endif
