# SPDX-License-Identifier: MIT
# Run by `cmake --install` (tools/twheel/CMakeLists.txt): twheel(1) as
# installed, from TW_MAN_IN into TW_MAN_OUT. Its SEE ALSO names the guides
# where this install puts them (TW_DOCDIR/guide, under the prefix given to
# `cmake --install`), and the section 3 pages only when TW_MAN3 (the API
# reference is installed too), so that every page it names is there.
set(_doc "${TW_DOCDIR}")
if(NOT IS_ABSOLUTE "${_doc}")
  set(_doc "${CMAKE_INSTALL_PREFIX}/${_doc}")
endif()
file(READ "${TW_MAN_IN}" _man)
string(REPLACE "docs/guide of the twheel source tree" "${_doc}/guide"
  _man "${_man}")
if(NOT TW_MAN3)
  string(REGEX REPLACE "\n\\.BR [a-z_.]+ \\(3\\)[,.]" "" _man "${_man}")
  string(REPLACE ".SH SEE ALSO\n.PP\n" ".SH SEE ALSO\n" _man "${_man}")
endif()
file(WRITE "${TW_MAN_OUT}" "${_man}")
