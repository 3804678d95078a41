# torch_mojo._torchcomms: the backend `mojo` of torchcomms, compiled against
# the headers of TORCH_MOJO_TORCHCOMMS_SOURCE and linked to the
# libtorchcomms.so of the torchcomms installed with this Python. A backend's
# C++ ABI follows torchcomms' version: the two must be the same release.
set(_tc_headers ${TORCH_MOJO_TORCHCOMMS_SOURCE}/comms/torchcomms/TorchCommBackend.hpp)
if(NOT EXISTS ${_tc_headers})
  message(FATAL_ERROR "TORCH_MOJO_TORCHCOMMS_SOURCE=${TORCH_MOJO_TORCHCOMMS_SOURCE}: no "
                      "comms/torchcomms/TorchCommBackend.hpp there; give torchcomms' source tree")
endif()
file(STRINGS ${TORCH_MOJO_TORCHCOMMS_SOURCE}/version.txt _tc_source_version LIMIT_COUNT 1)
execute_process(
  COMMAND ${Python_EXECUTABLE} -c
          "import importlib.metadata as m, importlib.util as u; print(m.version('torchcomms')); print(u.find_spec('torchcomms').submodule_search_locations[0])"
  OUTPUT_VARIABLE _tc_facts OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _tc_found ERROR_QUIET)
if(NOT _tc_found EQUAL 0)
  message(FATAL_ERROR "TORCH_MOJO_TORCHCOMMS_SOURCE is set but torchcomms is not installed for "
                      "${Python_EXECUTABLE}: install torchcomms ${_tc_source_version} first "
                      "(scripts/build-torchcomms.sh builds it for a CPU torch)")
endif()
string(REPLACE "\n" ";" _tc_facts "${_tc_facts}")
list(GET _tc_facts 0 TORCH_MOJO_BUILT_WITH_TORCHCOMMS)
list(GET _tc_facts 1 _tc_package_dir)
if(NOT TORCH_MOJO_BUILT_WITH_TORCHCOMMS STREQUAL _tc_source_version)
  message(FATAL_ERROR "the torchcomms installed is ${TORCH_MOJO_BUILT_WITH_TORCHCOMMS} but the "
                      "headers in ${TORCH_MOJO_TORCHCOMMS_SOURCE} are ${_tc_source_version}: give "
                      "the source tree of the release installed")
endif()
find_library(TORCHCOMMS_LIBRARY torchcomms PATHS ${_tc_package_dir} NO_DEFAULT_PATH)
find_path(GLOG_INCLUDE_DIR glog/logging.h)
find_library(GLOG_LIBRARY glog)
if(NOT TORCHCOMMS_LIBRARY OR NOT GLOG_INCLUDE_DIR OR NOT GLOG_LIBRARY)
  message(FATAL_ERROR "torchcomms backend: libtorchcomms.so in ${_tc_package_dir} "
                      "(${TORCHCOMMS_LIBRARY}) and glog (${GLOG_INCLUDE_DIR}, ${GLOG_LIBRARY}; "
                      "Debian: libgoogle-glog-dev) are both needed")
endif()

pybind11_add_module(_torchcomms MODULE
                    ${CMAKE_CURRENT_SOURCE_DIR}/cpp/torchcomms/torch_comm_mojo.cc
                    ${CMAKE_CURRENT_SOURCE_DIR}/cpp/torchcomms/torch_comm_mojo_calls.cc
                    ${CMAKE_CURRENT_SOURCE_DIR}/cpp/python/torchcomms_module.cc)
set_target_properties(_torchcomms PROPERTIES CXX_STANDARD 20
                      INSTALL_RPATH "$ORIGIN/lib;${_tc_package_dir}")
target_include_directories(_torchcomms BEFORE PRIVATE ${TORCH_INCLUDE_DIRS})  # torch's pybind11 (as _C)
target_include_directories(_torchcomms PRIVATE ${TORCH_MOJO_TORCHCOMMS_SOURCE} ${GLOG_INCLUDE_DIR})
target_compile_definitions(_torchcomms PRIVATE
                           TORCH_MOJO_BUILT_WITH_TORCHCOMMS="${TORCH_MOJO_BUILT_WITH_TORCHCOMMS}")
target_link_libraries(_torchcomms PRIVATE torch_mojo_backend ${TORCHCOMMS_LIBRARY} ${GLOG_LIBRARY}
                                          ${TORCH_PYTHON_LIBRARY})
install(TARGETS _torchcomms LIBRARY DESTINATION ${TORCH_MOJO_PACKAGE_DIR})
message(STATUS "torchcomms backend: built against torchcomms ${TORCH_MOJO_BUILT_WITH_TORCHCOMMS} "
               "(${_tc_package_dir})")
