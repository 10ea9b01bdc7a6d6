include(CMakePackageConfigHelpers)

install(TARGETS salus EXPORT salusTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/salus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS salusd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})  # the coordinator

set(SALUS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/salus)
install(EXPORT salusTargets NAMESPACE salus:: DESTINATION ${SALUS_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/salusConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/salusConfig.cmake
                              INSTALL_DESTINATION ${SALUS_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/salusConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/salusConfig.cmake ${PROJECT_BINARY_DIR}/salusConfigVersion.cmake
        DESTINATION ${SALUS_CMAKE_DIR})

# The .pc file finds its prefix from its own location, so `cmake --install --prefix X` (which
# does not reconfigure) yields a working file under X.
file(RELATIVE_PATH SALUS_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" SALUS_PC_TO_PREFIX "${SALUS_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/salus.pc.in ${PROJECT_BINARY_DIR}/salus.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/salus.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
