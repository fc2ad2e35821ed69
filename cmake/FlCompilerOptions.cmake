# Compiler options for the project's own targets.
#
# Warnings are applied per target (fl_target_defaults), not globally, so that generated protobuf/gRPC
# sources and third-party headers do not drown our own diagnostics; FL_WERROR makes them fatal (ci preset).

if(FL_SANITIZE)
  # Applied globally: every object in a sanitized binary must be instrumented consistently.
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

function(fl_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wcast-align
                                           -Wunused -Woverloaded-virtual -Wimplicit-fallthrough)
  if(FL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
