# cmake -DPTXAS=... -DPTX=in.ptx -DCUBIN=out.cubin -P assemble_ptx.cmake
# Assembles PTX for the architecture its own `.target` line names (sm_90a
# for sm_90), so that the driver loads machine code at once instead of
# compiling the PTX at a job's first collective.
file(STRINGS "${PTX}" _target REGEX "^\\.target " LIMIT_COUNT 1)
string(REGEX REPLACE "^\\.target +([a-z0-9_]+).*" "\\1" _target "${_target}")
execute_process(COMMAND "${PTXAS}" --gpu-name "${_target}" -O3 -o "${CUBIN}" "${PTX}"
                RESULT_VARIABLE _result)
if(NOT _result EQUAL 0)
  message(FATAL_ERROR "ptxas could not assemble ${PTX} for ${_target}")
endif()
