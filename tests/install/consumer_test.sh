#!/bin/bash
# Install ferry into a temporary prefix and build a tiny consumer against it, once with
# CMake's find_package(ferry) (target ferry::client) and once with pkg-config.
#   consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/ferry-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -x "$tmp/prefix/bin/ferryd"
test -x "$tmp/prefix/bin/ferryctl"
test -f "$tmp/prefix/include/ferry/client.h"

mkdir -p "$tmp/consumer"
cp "$src/client/examples/quickstart.cc" "$tmp/consumer/"
cat >"$tmp/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(ferry REQUIRED)
add_executable(consumer quickstart.cc)
target_link_libraries(consumer PRIVATE ferry::client)
CM
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
test -x "$tmp/consumer/build/consumer"
echo "find_package(ferry): consumer built"

export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig"
g++ -std=c++20 -o "$tmp/consumer/pc" "$tmp/consumer/quickstart.cc" $(pkg-config --cflags --libs ferry)
test -x "$tmp/consumer/pc"
echo "pkg-config ferry: consumer built"

# The consumer runs against a real daemon.
sock="$tmp/ferryd.sock"
"$tmp/prefix/bin/ferryd" --backend host --listen "unix:$sock" --ready-file "$tmp/ready" \
  --log-level warn &
pid=$!
for _ in $(seq 200); do [[ -s "$tmp/ready" ]] && break; sleep 0.05; done
status=0
"$tmp/consumer/pc" "unix:$sock" || status=$?
kill "$pid"; wait "$pid" || true
exit $status
