# CMake toolchain file: an arm64 (aarch64) build on an x86-64 Debian host, with Debian's
# cross toolchain (crossbuild-essential-arm64) and the :arm64 -dev packages of multiarch
# (dpkg --add-architecture arm64). deploy/olp-local build --arch arm64 uses it.
#
# The arm64 programs the build itself runs (olp-seccomp-gen, which writes olp-sandbox's
# seccomp program) and the CUnit suites under CTest run through qemu user emulation.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(OLP_CROSS_TRIPLE aarch64-linux-gnu)

set(CMAKE_C_COMPILER ${OLP_CROSS_TRIPLE}-gcc)
# The sysroot is the host's own / (multiarch): libraries in /usr/lib/aarch64-linux-gnu,
# headers in /usr/include and /usr/include/aarch64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE ${OLP_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH /usr/${OLP_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config reads the arm64 .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${OLP_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# qemu-user-static runs them: the arm64 loader and libraries are those of multiarch
# (libc6:arm64 and the rest, in /lib/ld-linux-aarch64.so.1 and /usr/lib/aarch64-linux-gnu),
# so it needs no -L prefix.
find_program(OLP_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(OLP_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${OLP_QEMU_AARCH64})
endif()
