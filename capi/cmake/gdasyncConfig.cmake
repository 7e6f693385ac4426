# gdasync's CMake package: find_package(gdasync) defines gdasync::gdasync (the shared library)
# and gdasync::gdasync_static (the static one, with the system libraries it needs), both with
# the include directory of gdasync.h and mp.h. Installed by scripts/install-c.sh.
get_filename_component(_gdasync_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET gdasync::gdasync)
  add_library(gdasync::gdasync SHARED IMPORTED)
  set_target_properties(gdasync::gdasync PROPERTIES
    IMPORTED_LOCATION "${_gdasync_prefix}/lib/libgdasync.so.0"
    IMPORTED_SONAME "libgdasync.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "${_gdasync_prefix}/include")
endif()

if(NOT TARGET gdasync::gdasync_static)
  add_library(gdasync::gdasync_static STATIC IMPORTED)
  set_target_properties(gdasync::gdasync_static PROPERTIES
    IMPORTED_LOCATION "${_gdasync_prefix}/lib/libgdasync.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_gdasync_prefix}/include"
    INTERFACE_LINK_LIBRARIES "dl;pthread;m;rt;util;gcc_s")
endif()

set(gdasync_INCLUDE_DIRS "${_gdasync_prefix}/include")
set(gdasync_LIBRARIES gdasync::gdasync)
unset(_gdasync_prefix)
