# ctest example_find_package: installs the build in BUILD_DIR into a scratch prefix, then configures,
# builds and runs examples/cpp as an outside project that finds FlashDSA with find_package(flashdsa).
set(prefix ${BUILD_DIR}/find_package_test/install)
set(example_build ${BUILD_DIR}/find_package_test/example)
file(REMOVE_RECURSE ${BUILD_DIR}/find_package_test)

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/cpp -B ${example_build} -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${example_build})
run(${example_build}/flashdsa_example)
