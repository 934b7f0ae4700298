# SPDX-License-Identifier: MIT
# The API reference: HTML and man pages (section 3, one name per public
# function, macro and type) from include/twheel/*.h and docs/, by Doxygen;
# then docs/man_functions.awk gives every public function a page of its own
# (synopsis and its header comment) in place of Doxygen's link to the
# header's page.
#   cmake --build B --target docs     -> B/docs/html/index.html, B/docs/man
# Any Doxygen warning (an undocumented public name among them) fails it.
# With TWHEEL_BUILD_DOCS=ON (the default when Doxygen is found) the
# reference is built with the library and `cmake --install` installs it
# (man pages into ${CMAKE_INSTALL_MANDIR}). Without Doxygen the docs target
# still exists and fails saying why, and configure says so too.
if(NOT TWHEEL_TOP_LEVEL AND NOT TWHEEL_BUILD_DOCS)
  return()
endif()
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  if(TWHEEL_BUILD_DOCS)
    message(FATAL_ERROR "TWHEEL_BUILD_DOCS needs Doxygen (Debian: doxygen)")
  endif()
  message(STATUS "twheel: Doxygen not found (Debian: doxygen): no API "
    "reference; `--target docs` fails, and the install has no section 3 "
    "man pages. Install Doxygen and configure again.")
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo
      "docs: Doxygen was not found when this tree was configured (Debian: doxygen); install it and configure again"
    COMMAND ${CMAKE_COMMAND} -E false
    VERBATIM)
  return()
endif()
# Off by default: the reference is part of the default build where Doxygen
# is found, and another Doxygen's warnings must not fail a user's build;
# the CI docs stage (scripts/test.d/45-docs.sh) turns it on.
option(TWHEEL_DOCS_WERROR "Fail the docs build on any Doxygen warning" OFF)
if(TWHEEL_DOCS_WERROR)
  set(TWHEEL_DOCS_WARN_AS_ERROR FAIL_ON_WARNINGS)
else()
  set(TWHEEL_DOCS_WARN_AS_ERROR NO)
endif()
set(TWHEEL_DOCS_OUT ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in
  ${TWHEEL_DOCS_OUT}/Doxyfile @ONLY)
file(GLOB _tw_doc_headers CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/twheel/*.h)
file(GLOB _tw_doc_inputs CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/twheel/*.h ${PROJECT_SOURCE_DIR}/docs/*.md
  ${PROJECT_SOURCE_DIR}/docs/guide/*.md)
add_custom_command(OUTPUT ${TWHEEL_DOCS_OUT}/stamp
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${TWHEEL_DOCS_OUT}/html
    ${TWHEEL_DOCS_OUT}/man
  COMMAND Doxygen::doxygen ${TWHEEL_DOCS_OUT}/Doxyfile
  COMMAND sh ${PROJECT_SOURCE_DIR}/docs/man_tidy.sh ${TWHEEL_DOCS_OUT}/man/man3
  COMMAND awk -v outdir=${TWHEEL_DOCS_OUT}/man/man3
    -v version=${PROJECT_VERSION}
    -f ${PROJECT_SOURCE_DIR}/docs/man_functions.awk ${_tw_doc_headers}
    > ${TWHEEL_DOCS_OUT}/man_functions.txt
  COMMAND ${CMAKE_COMMAND} -E touch ${TWHEEL_DOCS_OUT}/stamp
  DEPENDS ${_tw_doc_inputs} ${TWHEEL_DOCS_OUT}/Doxyfile
    ${PROJECT_SOURCE_DIR}/docs/doxyfilter.awk
    ${PROJECT_SOURCE_DIR}/docs/man_tidy.sh
    ${PROJECT_SOURCE_DIR}/docs/man_functions.awk
  WORKING_DIRECTORY ${TWHEEL_DOCS_OUT}
  COMMENT "Doxygen: API reference in ${TWHEEL_DOCS_OUT}"
  VERBATIM)
if(TWHEEL_BUILD_DOCS)
  message(STATUS "twheel: API reference built with the library and "
    "installed (man 3 pages, HTML); -DTWHEEL_BUILD_DOCS=OFF leaves it out")
  add_custom_target(docs ALL DEPENDS ${TWHEEL_DOCS_OUT}/stamp)
  if(TWHEEL_INSTALL)
    install(DIRECTORY ${TWHEEL_DOCS_OUT}/man/man3
      DESTINATION ${CMAKE_INSTALL_MANDIR})
    install(DIRECTORY ${TWHEEL_DOCS_OUT}/html
      DESTINATION ${CMAKE_INSTALL_DOCDIR})
  endif()
else()
  message(STATUS "twheel: API reference not built with the library nor "
    "installed (TWHEEL_BUILD_DOCS=OFF); `--target docs` builds it")
  add_custom_target(docs DEPENDS ${TWHEEL_DOCS_OUT}/stamp)
endif()
