# Applies SALUS_SANITIZE to every target defined after this point.
if(SALUS_SANITIZE)
  list(JOIN SALUS_SANITIZE "," _salus_sanitizers)
  add_compile_options(-fsanitize=${_salus_sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_salus_sanitizers})
  if(CMAKE_C_COMPILER_ID MATCHES "Clang")
    # clang links the C++ part of a sanitizer's runtime (UBSan's vptr checks) only into a C++
    # link; a C program over libsalus (C++) needs it too, and the C++ library it rests on.
    add_link_options($<$<LINK_LANGUAGE:C>:-fsanitize-link-c++-runtime>
                     $<$<LINK_LANGUAGE:C>:-lstdc++>)
  endif()
endif()
