# DFLASH_PORTABLE: the build that goes into the wheel (pyproject.toml, `make wheel`). The three binaries must run
# on any Linux with glibc >= the manylinux tag auditwheel gives them, with nothing else installed. So:
#  - libstdc++/libgcc are linked statically: the system libstdc++ of an older distribution lacks GLIBCXX_3.4.30
#    (GCC 12, Debian 12), and auditwheel may not graft it (it is on the manylinux whitelist);
#  - fmt, spdlog and toml++ are compiled in header-only (Debian ships only their .so; a grafted .so would bring
#    its own dynamic libstdc++ beside the static one, and exceptions crossing between the two are not safe);
#  - OpenSSL's libcrypto and libarchive (with the compressors Debian ships as .a) are linked statically;
#  - what is left (libzstd, liblz4, libacl: no .a in Debian) auditwheel grafts into the wheel;
#  - except dflash-launch and dflash-guardian (which links the supervisor), when prometheus-cpp is there: Debian
#    ships it and civetweb only as shared libraries built against the dynamic libstdc++, and one process must not
#    hold two libstdc++ (exceptions and std::string cross between them). So these two link the system's
#    libstdc++/libgcc_s (on the manylinux whitelist; GCC 12's GLIBCXX_3.4.30 is inside the manylinux_2_35
#    policy, the wheel's tag) and auditwheel grafts libprometheus-cpp-core/-pull and
#    libcivetweb(-cpp) into dflash_launch.libs/, as for libzstd. The other three binaries keep the static runtime.
#    Issue #59: the wheel serves the same metrics as the source build.
# docs/wheel.md lists the result (`auditwheel show`).

add_library(dflash_toml_ho INTERFACE)
target_compile_definitions(dflash_toml_ho INTERFACE TOML_HEADER_ONLY=1)
add_library(tomlplusplus::tomlplusplus ALIAS dflash_toml_ho)

add_library(dflash_fmt_ho INTERFACE)
target_compile_definitions(dflash_fmt_ho INTERFACE FMT_HEADER_ONLY=1)
add_library(fmt::fmt ALIAS dflash_fmt_ho)

add_library(dflash_spdlog_ho INTERFACE)
target_compile_definitions(dflash_spdlog_ho INTERFACE SPDLOG_FMT_EXTERNAL=1)
target_link_libraries(dflash_spdlog_ho INTERFACE dflash_fmt_ho)
add_library(spdlog::spdlog ALIAS dflash_spdlog_ho)

set(OPENSSL_USE_STATIC_LIBS TRUE)

# libarchive.a and what its filters need; a static archive where Debian has one, else the shared library.
find_library(DFLASH_LIBARCHIVE_A NAMES libarchive.a REQUIRED)
add_library(dflash_archive_static INTERFACE)
set(archive_deps)
foreach(dep nettle acl lzma zstd lz4 bz2 z)
  find_library(DFLASH_DEP_${dep} NAMES lib${dep}.a ${dep} lib${dep}.so.1 REQUIRED)
  list(APPEND archive_deps ${DFLASH_DEP_${dep}})
endforeach()
target_link_libraries(dflash_archive_static INTERFACE ${DFLASH_LIBARCHIVE_A} ${archive_deps})
add_library(LibArchive::LibArchive ALIAS dflash_archive_static)
set(LibArchive_FOUND TRUE)

# --gc-sections: libarchive.a's archive_write_set_format.o (pulled in by the pax writer for one helper) refers
# to every format writer, xar's among them, which needs libxml2 (and through it ICU, 31 MB). Nothing reaches
# those writers, so their sections are dropped and their references with them; ld still fails on any undefined
# symbol in a section that is kept.
add_link_options(-static-libstdc++ -static-libgcc -Wl,--gc-sections -s)  # -s: no symbol tables in the wheel

# The binaries that link prometheus-cpp: the dynamic libstdc++ the grafted prometheus-cpp and civetweb use (see the top).
function(dflash_portable_metrics_runtime)
  if(NOT TARGET prometheus-cpp::pull)
    message(STATUS "prometheus-cpp not found: this portable build serves no metrics (run_metrics_off.cc)")
    return()
  endif()
  foreach(target IN LISTS ARGN)
    get_target_property(opts ${target} LINK_OPTIONS)
    list(REMOVE_ITEM opts -static-libstdc++ -static-libgcc)
    set_target_properties(${target} PROPERTIES LINK_OPTIONS "${opts}")
  endforeach()
endfunction()
