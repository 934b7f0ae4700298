# SPDX-License-Identifier: MIT
# A Debian package of everything `cmake --install` installs:
#   cmake -S . -B build -DCMAKE_INSTALL_PREFIX=/usr && cmake --build build
#   (cd build && cpack -G DEB)
# One package, "twheel": the shared and static libraries, headers, the CMake
# and pkg-config files, and the man pages when TWHEEL_BUILD_DOCS is ON.
set(CPACK_PACKAGE_NAME twheel)
set(CPACK_PACKAGE_VENDOR "the twheel authors")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_CONTACT "the twheel authors")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "the twheel authors")
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# Depends: from the libraries' own needs (dpkg-shlibdeps, in dpkg-dev).
find_program(TWHEEL_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(TWHEEL_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6")
endif()
set(CPACK_GENERATOR DEB)
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES "/build.*/" "/\\\\.git/")
include(CPack)
