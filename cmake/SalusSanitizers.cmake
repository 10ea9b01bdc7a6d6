# Applies SALUS_SANITIZE to every target defined after this point.
if(SALUS_SANITIZE)
  list(JOIN SALUS_SANITIZE "," _salus_sanitizers)
  add_compile_options(-fsanitize=${_salus_sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_salus_sanitizers})
endif()
