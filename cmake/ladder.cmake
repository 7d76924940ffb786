# ladder_instances(<out_var> TEMPLATE <file.cu.in> HEAD_DIMS <d...> DTYPES <bf16|fp16...>
#                  [EXTRA <name> <value>])
#
# One translation unit per kernel instantiation, so a parallel build compiles them side
# by side. The template sees @HEAD_DIM@, @DTYPE@ (bf16 | fp16) and @DTYPE_T@ (the CUDA
# element type); each generated file is <template name>_d<d>_<dtype>.cu in the build tree.
function(ladder_instances out_var)
  cmake_parse_arguments(ARG "" "TEMPLATE" "HEAD_DIMS;DTYPES" ${ARGN})
  get_filename_component(stem ${ARG_TEMPLATE} NAME_WE)
  set(files)
  foreach(HEAD_DIM IN LISTS ARG_HEAD_DIMS)
    foreach(DTYPE IN LISTS ARG_DTYPES)
      if(DTYPE STREQUAL "bf16")
        set(DTYPE_T "__nv_bfloat16")
      elseif(DTYPE STREQUAL "fp16")
        set(DTYPE_T "__half")
      else()
        message(FATAL_ERROR "ladder_instances: unknown dtype ${DTYPE}")
      endif()
      set(out ${CMAKE_CURRENT_BINARY_DIR}/${stem}_d${HEAD_DIM}_${DTYPE}.cu)
      configure_file(${ARG_TEMPLATE} ${out} @ONLY)
      list(APPEND files ${out})
    endforeach()
  endforeach()
  set(${out_var} ${files} PARENT_SCOPE)
endfunction()

# ladder_stage_head_dims(<stages source> <d...>)
#
# A rung's list of head dims lives once, in its CMakeLists.txt: the same list goes to
# ladder_instances() (which kernels are compiled) and, through this, to the Stage record
# in <stages source> as the macro LADDER_HEAD_DIMS (`s.head_dims = {LADDER_HEAD_DIMS};`),
# so a head dim cannot be registered without its kernel or compiled without being offered.
function(ladder_stage_head_dims source)
  list(JOIN ARGN "," dims)
  # The kernels' library is defined at the top level: the property must be visible there.
  set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/${source} TARGET_DIRECTORY attn_ladder
               APPEND PROPERTY COMPILE_DEFINITIONS "LADDER_HEAD_DIMS=${dims}")
endfunction()
