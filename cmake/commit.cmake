# SPDX-License-Identifier: Apache-2.0
# cmake -DSOURCE_DIR=... -DOUTPUT=... -P commit.cmake
#
# Writes OUTPUT, a header that defines STOKER_COMMIT as SOURCE_DIR's commit (git describe
# --always --dirty), or as "" when SOURCE_DIR is not the top of a git checkout of its own (a
# release tarball, or stoker copied into another project's repository, whose commit says
# nothing of stoker's). Run at every build; OUTPUT changes only when the commit does, so that
# only what includes it is rebuilt.
set(commit "")
find_program(git_program git)
if(git_program)
  execute_process(COMMAND ${git_program} -C ${SOURCE_DIR} rev-parse --show-toplevel
                  OUTPUT_VARIABLE top RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(status EQUAL 0)
    file(REAL_PATH "${top}" top)
    file(REAL_PATH "${SOURCE_DIR}" source)
    if(top STREQUAL source)
      execute_process(COMMAND ${git_program} -C ${SOURCE_DIR} describe --always --dirty --abbrev=12
                      OUTPUT_VARIABLE commit RESULT_VARIABLE status OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(NOT status EQUAL 0)
        set(commit "")
      endif()
    endif()
  endif()
endif()
file(WRITE ${OUTPUT}.new "// Generated at build time by cmake/commit.cmake.\n#pragma once\n#define STOKER_COMMIT \"${commit}\"\n")
file(COPY_FILE ${OUTPUT}.new ${OUTPUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUTPUT}.new)
