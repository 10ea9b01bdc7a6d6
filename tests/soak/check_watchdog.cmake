# Runs salus_soak with one thread wedged after 1 s and a 5 s stuck limit; the watchdog must name
# the wedged thread, print its stack (with the wedging function in it) and exit with code 3.
execute_process(COMMAND ${SOAK} --seconds 60 --seed 7 --stuck-seconds 5 --simulate-hang 1
                RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 90)
message("${out}${err}")
set(failed "")
if(NOT code EQUAL 3)
  string(APPEND failed "exit code ${code}, expected 3 (the watchdog's); ")
endif()
if(NOT err MATCHES "WATCHDOG: stuck: thread 'soak-job00' \\(tid [0-9]+\\) made no progress")
  string(APPEND failed "no report naming the wedged thread soak-job00; ")
endif()
# The stack dumped from the wedged thread: its header, then frames down to Population::wedge.
if(NOT err MATCHES "WATCHDOG: stack of thread [0-9]+ \\(registered as 'soak-job00'\\):\n[^W]*Population5wedge")
  string(APPEND failed "the wedged thread's stack does not show Population::wedge; ")
endif()
if(NOT err MATCHES "WATCHDOG: stack of thread [0-9]+ \\(registered as 'soak-cancel'\\):\n[^W]*end of stack")
  string(APPEND failed "no stack from the other threads (soak-cancel); ")
endif()
if(failed)
  message(FATAL_ERROR "watchdog self-test: ${failed}")
endif()
